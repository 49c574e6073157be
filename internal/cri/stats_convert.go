package cri

import (
	"context"
	"errors"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/stats"
)

// defaultInterface is the pod interface CNI creates; the kubelet reports
// it as the pod's network.
const defaultInterface = "eth0"

func u64(v uint64) *runtime.UInt64Value { return &runtime.UInt64Value{Value: v} }

// containerStats samples one container. A container without a cgroup
// (exited) reports its attributes and writable layer only.
func (s *Service) containerStats(c *container.Container) (*runtime.ContainerStats, error) {
	cs := &runtime.ContainerStats{Attributes: &runtime.ContainerAttributes{
		Id:          c.ID,
		Metadata:    &runtime.ContainerMetadata{Name: c.Name, Attempt: c.Attempt},
		Labels:      c.Labels,
		Annotations: c.Annotations,
	}}
	upper, err := s.containers.UpperDir(c.ID)
	if err != nil {
		return nil, err
	}
	var sample *stats.ContainerSample
	if c.State != container.StateExited {
		cgPath, err := s.containers.CgroupsPath(c.ID)
		if err != nil {
			return nil, err
		}
		sample, err = s.stats.Container(c.ID, cgPath, upper)
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	if sample == nil {
		b, n, err := stats.DirUsage(upper)
		if err != nil {
			return nil, err
		}
		sample = &stats.ContainerSample{WritableBytes: b, WritableInodes: n, WritableAt: time.Now()}
	}
	if sample.Usage != nil {
		cs.Cpu, cs.Memory, cs.Swap = cpuMemSwap(sample.Sample)
		cs.Io = ioUsage(sample.Sample)
	}
	cs.WritableLayer = &runtime.FilesystemUsage{
		Timestamp:  sample.WritableAt.UnixNano(),
		FsId:       &runtime.FilesystemIdentifier{Mountpoint: s.writableLayerFs()},
		UsedBytes:  u64(sample.WritableBytes),
		InodesUsed: u64(sample.WritableInodes),
	}
	return cs, nil
}

func cpuMemSwap(smp stats.Sample) (*runtime.CpuUsage, *runtime.MemoryUsage, *runtime.SwapUsage) {
	u := smp.Usage
	ts := u.Timestamp.UnixNano()
	cpu := &runtime.CpuUsage{Timestamp: ts, UsageCoreNanoSeconds: u64(u.CPUUsageNanos), UsageNanoCores: u64(smp.NanoCores), Psi: criPSI(u.CPUPressure)}
	mem := &runtime.MemoryUsage{
		Timestamp:       ts,
		WorkingSetBytes: u64(u.WorkingSet),
		AvailableBytes:  u64(u.AvailableBytes()),
		UsageBytes:      u64(u.MemoryUsage),
		RssBytes:        u64(u.RSS),
		PageFaults:      u64(u.PageFaults),
		MajorPageFaults: u64(u.MajorPageFaults),
		Psi:             criPSI(u.MemoryPressure),
	}
	swap := &runtime.SwapUsage{Timestamp: ts, SwapUsageBytes: u64(u.SwapUsage)}
	return cpu, mem, swap
}

// ioUsage is the I/O pressure, the only I/O figure the CRI carries; nil
// where the kernel exposes none.
func ioUsage(smp stats.Sample) *runtime.IoUsage {
	if smp.IOPressure == nil {
		return nil
	}
	return &runtime.IoUsage{Timestamp: smp.Timestamp.UnixNano(), Psi: criPSI(smp.IOPressure)}
}

// criPSI converts pressure stall information (KEP-4205); nil (absent, not
// zero) where the kernel exposes none.
func criPSI(p *stats.Pressure) *runtime.PsiStats {
	if p == nil {
		return nil
	}
	line := func(d *stats.PSI) *runtime.PsiData {
		if d == nil {
			return nil
		}
		return &runtime.PsiData{Total: d.TotalNanos, Avg10: d.Avg10, Avg60: d.Avg60, Avg300: d.Avg300}
	}
	return &runtime.PsiStats{Some: line(p.Some), Full: line(p.Full)}
}

// containersByPod indexes every container by its pod, once per list of
// pods rather than once per pod.
func (s *Service) containersByPod() map[string][]*container.Container {
	byPod := map[string][]*container.Container{}
	for c := range s.containers.All() {
		byPod[c.PodID] = append(byPod[c.PodID], c)
	}
	return byPod
}

// podStats samples a pod's cgroup (all its containers), its network
// namespace while it is ready, and each of ctrs, the pod's containers.
func (s *Service) podStats(ctx context.Context, sb *sandbox.Sandbox, ctrs []*container.Container) (*runtime.PodSandboxStats, error) {
	netns := sb.NetNSPath
	if sb.State != runtime.PodSandboxState_SANDBOX_READY {
		netns = "" // the namespace pin is gone with the stop
	}
	sample, err := s.stats.Pod(sb.ID, sb.CgroupParent, netns)
	if err != nil {
		return nil, err
	}
	md := sb.Config.GetMetadata()
	linux := &runtime.LinuxPodSandboxStats{
		Process: &runtime.ProcessUsage{Timestamp: sample.Timestamp.UnixNano(), ProcessCount: u64(sample.Processes)},
	}
	linux.Cpu, linux.Memory, _ = cpuMemSwap(sample.Sample)
	linux.Io = ioUsage(sample.Sample)
	if sample.Interfaces != nil {
		linux.Network = &runtime.NetworkUsage{Timestamp: sample.NetworkAt.UnixNano()}
		for _, i := range sample.Interfaces {
			iu := &runtime.NetworkInterfaceUsage{Name: i.Name, RxBytes: u64(i.RxBytes), RxErrors: u64(i.RxErrors), TxBytes: u64(i.TxBytes), TxErrors: u64(i.TxErrors)}
			if i.Name == defaultInterface {
				linux.Network.DefaultInterface = iu
			}
			linux.Network.Interfaces = append(linux.Network.Interfaces, iu)
		}
	}
	for _, c := range ctrs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		cs, err := s.containerStats(c)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue // removed meanwhile
			}
			return nil, err
		}
		linux.Containers = append(linux.Containers, cs)
	}
	return &runtime.PodSandboxStats{
		Attributes: &runtime.PodSandboxAttributes{
			Id: sb.ID, Metadata: md, Labels: sb.Config.GetLabels(), Annotations: sb.Config.GetAnnotations(),
		},
		Linux: linux,
	}, nil
}

// matchLabels reports whether labels hold every selector pair.
func matchLabels(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
