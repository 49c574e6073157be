package cri

import (
	"context"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/sandbox"
)

// ListPodSandboxMetrics reports cAdvisor-style metrics for every ready pod
// (its network) and its containers (CPU, memory, processes, writable
// layer), labelled as cAdvisor labels them. Objects that fail to sample are
// left out and logged, as in containerd.
func (s *Service) ListPodSandboxMetrics(ctx context.Context, req *runtime.ListPodSandboxMetricsRequest) (*runtime.ListPodSandboxMetricsResponse, error) {
	byPod := map[string][]*container.Container{}
	for _, c := range s.containers.List() {
		byPod[c.PodID] = append(byPod[c.PodID], c)
	}
	resp := &runtime.ListPodSandboxMetricsResponse{PodMetrics: []*runtime.PodSandboxMetrics{}}
	for _, sb := range s.sandboxes.List() {
		if sb.State != runtime.PodSandboxState_SANDBOX_READY {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, toStatus(err)
		}
		pm, err := s.podMetrics(sb, byPod[sb.ID])
		if err != nil {
			s.log.Warn("pod metrics", "pod", sb.ID, "err", err)
			continue
		}
		resp.PodMetrics = append(resp.PodMetrics, pm)
	}
	return resp, nil
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
	if sb.NetNSPath != "" {
		sample, err := s.stats.Pod(sb.ID, sb.CgroupParent, sb.NetNSPath)
		if err != nil {
			return nil, err
		}
		pod := &metricSet{ts: sample.NetworkAt.UnixNano(), labels: []string{md.GetName(), md.GetNamespace(), "", sb.ID, ""}}
		for _, i := range sample.Interfaces {
			pod.add("container_network_receive_bytes_total", runtime.MetricType_COUNTER, i.RxBytes, i.Name)
			pod.add("container_network_receive_errors_total", runtime.MetricType_COUNTER, i.RxErrors, i.Name)
			pod.add("container_network_transmit_bytes_total", runtime.MetricType_COUNTER, i.TxBytes, i.Name)
			pod.add("container_network_transmit_errors_total", runtime.MetricType_COUNTER, i.TxErrors, i.Name)
		}
		pm.Metrics = pod.out
	}
	for _, c := range ctrs {
		if c.State != container.StateRunning {
			continue
		}
		cs, err := s.containerStats(c)
		if err != nil {
			s.log.Warn("container metrics", "pod", sb.ID, "container", c.ID, "err", err)
			continue
		}
		m := &metricSet{ts: time.Now().UnixNano(), labels: []string{md.GetName(), md.GetNamespace(), c.Name, c.ID, c.Image}}
		m.add("container_last_seen", runtime.MetricType_GAUGE, uint64(time.Now().Unix()))
		m.add("container_start_time_seconds", runtime.MetricType_GAUGE, uint64(c.StartedAt.Unix()))
		if cs.Cpu != nil {
			m.add("container_cpu_usage_seconds_total", runtime.MetricType_COUNTER, cs.Cpu.GetUsageCoreNanoSeconds().GetValue()/uint64(time.Second))
		}
		if mem := cs.Memory; mem != nil {
			m.add("container_memory_usage_bytes", runtime.MetricType_GAUGE, mem.GetUsageBytes().GetValue())
			m.add("container_memory_working_set_bytes", runtime.MetricType_GAUGE, mem.GetWorkingSetBytes().GetValue())
			m.add("container_memory_rss", runtime.MetricType_GAUGE, mem.GetRssBytes().GetValue())
			m.add("container_memory_swap", runtime.MetricType_GAUGE, cs.GetSwap().GetSwapUsageBytes().GetValue())
		}
		m.add("container_spec_memory_limit_bytes", runtime.MetricType_GAUGE, uint64(max(c.Resources.GetMemoryLimitInBytes(), 0)))
		if cs.WritableLayer != nil {
			dev := cs.WritableLayer.GetFsId().GetMountpoint()
			m.add("container_fs_usage_bytes", runtime.MetricType_GAUGE, cs.WritableLayer.GetUsedBytes().GetValue(), dev)
		}
		pm.ContainerMetrics = append(pm.ContainerMetrics, &runtime.ContainerMetrics{ContainerId: c.ID, Metrics: m.out})
	}
	return pm, nil
}
