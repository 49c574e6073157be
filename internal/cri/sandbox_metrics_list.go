package cri

import (
	"context"
	"strconv"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
	"github.com/berthcri/berth/internal/stats"
)

// ListPodSandboxMetrics reports cAdvisor-style metrics for every ready pod
// (its network) and its running containers (CPU, memory, processes,
// writable layer, block I/O, spec limits), labelled as cAdvisor labels
// them. Objects that fail to sample are
// left out and logged, as in containerd.
func (s *Service) ListPodSandboxMetrics(ctx context.Context, req *runtime.ListPodSandboxMetricsRequest) (*runtime.ListPodSandboxMetricsResponse, error) {
	resp := &runtime.ListPodSandboxMetricsResponse{PodMetrics: []*runtime.PodSandboxMetrics{}}
	err := s.eachPodMetrics(ctx, func(pm *runtime.PodSandboxMetrics) error {
		resp.PodMetrics = append(resp.PodMetrics, pm)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// eachPodMetrics samples the ready pods one by one, for
// ListPodSandboxMetrics and StreamPodSandboxMetrics; it stops at the first
// error of fn or of ctx.
func (s *Service) eachPodMetrics(ctx context.Context, fn func(*runtime.PodSandboxMetrics) error) error {
	byPod := s.containersByPod()
	for sb := range s.sandboxes.All() {
		if sb.State != runtime.PodSandboxState_SANDBOX_READY {
			continue
		}
		if err := ctx.Err(); err != nil {
			return toStatus(err)
		}
		pm, err := s.podMetrics(sb, byPod[sb.ID])
		if err != nil {
			s.log.Warn("pod metrics", "pod", sb.ID, "err", err)
			continue
		}
		if err := fn(pm); err != nil {
			return err
		}
	}
	return nil
}

// metricSet builds metrics sharing labels and a timestamp.
type metricSet struct {
	ts     int64
	labels []string
	out    []*runtime.Metric
}

func (m *metricSet) add(name string, kind runtime.MetricType, v uint64, extra ...string) {
	m.out = append(m.out, &runtime.Metric{
		Name: name, Timestamp: m.ts, MetricType: kind,
		LabelValues: append(append([]string(nil), m.labels...), extra...),
		Value:       u64(v),
	})
}

func (s *Service) podMetrics(sb *sandbox.Sandbox, ctrs []*container.Container) (*runtime.PodSandboxMetrics, error) {
	md := sb.Config.GetMetadata()
	pm := &runtime.PodSandboxMetrics{PodSandboxId: sb.ID}
	// The pod's cgroup (pressure) and, with its own network namespace,
	// its interfaces.
	sample, err := s.stats.Pod(sb.ID, sb.CgroupParent, sb.NetNSPath)
	if err != nil {
		return nil, err
	}
	labels := []string{md.GetName(), md.GetNamespace(), "", sb.ID, ""}
	pod := &metricSet{ts: sample.NetworkAt.UnixNano(), labels: labels}
	for _, i := range sample.Interfaces {
		pod.add("container_network_receive_bytes_total", counter, i.RxBytes, i.Name)
		pod.add("container_network_receive_packets_total", counter, i.RxPackets, i.Name)
		pod.add("container_network_receive_packets_dropped_total", counter, i.RxDropped, i.Name)
		pod.add("container_network_receive_errors_total", counter, i.RxErrors, i.Name)
		pod.add("container_network_transmit_bytes_total", counter, i.TxBytes, i.Name)
		pod.add("container_network_transmit_packets_total", counter, i.TxPackets, i.Name)
		pod.add("container_network_transmit_packets_dropped_total", counter, i.TxDropped, i.Name)
		pod.add("container_network_transmit_errors_total", counter, i.TxErrors, i.Name)
	}
	pressure := &metricSet{ts: sample.Timestamp.UnixNano(), labels: labels}
	pressure.addPressure(sample.Usage)
	pm.Metrics = append(pod.out, pressure.out...)
	for _, c := range ctrs {
		if c.State != container.StateRunning {
			continue
		}
		cm, err := s.containerMetrics(md, c)
		if err != nil {
			s.log.Warn("container metrics", "pod", sb.ID, "container", c.ID, "err", err)
			continue
		}
		pm.ContainerMetrics = append(pm.ContainerMetrics, cm)
	}
	return pm, nil
}

// addPressure adds pressure stall information as cAdvisor names it:
// "waiting" is the time some task stalled, "stalled" the time all did.
// Only what the kernel exposes (cgroup v2), in whole seconds as the CPU
// counters.
func (m *metricSet) addPressure(u *stats.Usage) {
	sec := uint64(time.Second)
	for _, p := range []struct {
		resource string
		psi      *stats.Pressure
	}{{"cpu", u.CPUPressure}, {"memory", u.MemoryPressure}, {"io", u.IOPressure}} {
		if p.psi == nil {
			continue
		}
		if p.psi.Some != nil {
			m.add("container_pressure_"+p.resource+"_waiting_seconds_total", counter, p.psi.Some.TotalNanos/sec)
		}
		if p.psi.Full != nil {
			m.add("container_pressure_"+p.resource+"_stalled_seconds_total", counter, p.psi.Full.TotalNanos/sec)
		}
	}
}

const (
	counter = runtime.MetricType_COUNTER
	gauge   = runtime.MetricType_GAUGE
)

// Kernel defaults a container gets when its spec leaves CPU period or
// shares unset.
const (
	defaultCPUPeriod = 100000
	defaultCPUShares = 1024
)

// containerMetrics samples a running container: its cgroup, processes and
// writable layer, with its spec's limits.
func (s *Service) containerMetrics(md *runtime.PodSandboxMetadata, c *container.Container) (*runtime.ContainerMetrics, error) {
	upper, err := s.containers.UpperDir(c.ID)
	if err != nil {
		return nil, err
	}
	cgPath, err := s.containers.CgroupsPath(c.ID)
	if err != nil {
		return nil, err
	}
	smp, err := s.stats.Container(c.ID, cgPath, upper)
	if err != nil {
		return nil, err
	}
	u := smp.Usage
	m := &metricSet{ts: u.Timestamp.UnixNano(), labels: []string{md.GetName(), md.GetNamespace(), c.Name, c.ID, c.Image}}
	m.add("container_last_seen", gauge, uint64(time.Now().Unix()))
	m.add("container_start_time_seconds", gauge, uint64(c.StartedAt.Unix()))

	// The CRI value is an integer: whole seconds, as containerd sends.
	sec := uint64(time.Second)
	m.add("container_cpu_usage_seconds_total", counter, u.CPUUsageNanos/sec)
	m.add("container_cpu_user_seconds_total", counter, u.CPUUserNanos/sec)
	m.add("container_cpu_system_seconds_total", counter, u.CPUSystemNanos/sec)
	m.add("container_cpu_cfs_periods_total", counter, u.CFSPeriods)
	m.add("container_cpu_cfs_throttled_periods_total", counter, u.CFSThrottledPeriods)
	m.add("container_cpu_cfs_throttled_seconds_total", counter, u.CFSThrottledNanos/sec)

	m.add("container_memory_usage_bytes", gauge, u.MemoryUsage)
	m.add("container_memory_working_set_bytes", gauge, u.WorkingSet)
	m.add("container_memory_rss", gauge, u.RSS)
	m.add("container_memory_swap", gauge, u.SwapUsage)
	m.add("container_memory_cache", gauge, u.MemoryCache)
	m.add("container_memory_mapped_file", gauge, u.MemoryMappedFile)
	m.add("container_memory_kernel_usage", gauge, u.MemoryKernel)
	m.add("container_memory_max_usage_bytes", gauge, u.MemoryMaxUsage)
	m.add("container_memory_failcnt", counter, u.MemoryFailcnt)
	m.add("container_memory_failures_total", counter, u.OwnPageFaults, "pgfault", "container")
	m.add("container_memory_failures_total", counter, u.OwnMajorPageFaults, "pgmajfault", "container")
	m.add("container_memory_failures_total", counter, u.PageFaults, "pgfault", "hierarchy")
	m.add("container_memory_failures_total", counter, u.MajorPageFaults, "pgmajfault", "hierarchy")
	m.add("container_oom_events_total", counter, u.OOMKills)

	m.addPressure(u)

	m.add("container_processes", gauge, u.Processes)
	m.add("container_threads", gauge, u.Threads)
	m.add("container_threads_max", gauge, u.ThreadsMax)
	m.add("container_file_descriptors", gauge, u.FileDescriptors)
	m.add("container_sockets", gauge, u.Sockets)

	// The limits as written into the container's OCI spec (the one
	// conversion, with the host's swap accounting); 0 for memory and swap
	// means unlimited.
	period, shares, swap := uint64(defaultCPUPeriod), uint64(defaultCPUShares), uint64(0)
	if spec := specgen.Resources(c.Resources, s.host); spec != nil {
		if cpu := spec.CPU; cpu != nil && cpu.Period != nil {
			period = *cpu.Period
		}
		if cpu := spec.CPU; cpu != nil && cpu.Shares != nil {
			shares = *cpu.Shares
		}
		if mem := spec.Memory; mem != nil && mem.Swap != nil && *mem.Swap > 0 {
			swap = uint64(*mem.Swap)
		}
	}
	m.add("container_spec_memory_limit_bytes", gauge, uint64(max(c.Resources.GetMemoryLimitInBytes(), 0)))
	m.add("container_spec_memory_swap_limit_bytes", gauge, swap)
	m.add("container_spec_cpu_period", gauge, period)
	m.add("container_spec_cpu_shares", gauge, shares)

	dev := s.writableLayerFs()
	m.add("container_fs_usage_bytes", gauge, smp.WritableBytes, dev)
	m.add("container_fs_limit_bytes", gauge, smp.Fs.LimitBytes, dev)
	m.add("container_fs_inodes_total", gauge, smp.Fs.Inodes, dev)
	m.add("container_fs_inodes_free", gauge, smp.Fs.InodesFree, dev)

	for _, io := range u.IO {
		major, minor := strconv.FormatUint(io.Major, 10), strconv.FormatUint(io.Minor, 10)
		m.add("container_fs_reads_bytes_total", counter, io.ReadBytes, io.Device)
		m.add("container_fs_writes_bytes_total", counter, io.WriteBytes, io.Device)
		m.add("container_fs_reads_total", counter, io.Reads, io.Device)
		m.add("container_fs_writes_total", counter, io.Writes, io.Device)
		m.add("container_blkio_device_usage_total", counter, io.ReadBytes, io.Device, major, minor, "Read")
		m.add("container_blkio_device_usage_total", counter, io.WriteBytes, io.Device, major, minor, "Write")
	}
	return &runtime.ContainerMetrics{ContainerId: c.ID, Metrics: m.out}, nil
}
