package daemon

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/metrics"
	"github.com/berthcri/berth/internal/sandbox"
)

// registerObjectCounts adds the scrape-time metrics over the stores: pods
// and containers by state, the pods the node's monitor serves (pods with
// containers; one keeper and one monitor serve them all, decision 1701,
// and a pod leaves the monitor with its last container), and the CRI log
// records the monitor could not write for each container.
func registerObjectCounts(m *metrics.Metrics, sandboxes *sandbox.Store, containers *container.Store) {
	m.CountFunc("berth_pods", "Pod sandboxes by state.", "state", func() map[string]float64 {
		out := map[string]float64{"ready": 0, "notready": 0}
		for _, sb := range sandboxes.List() {
			if sb.State == criapi.PodSandboxState_SANDBOX_READY {
				out["ready"]++
			} else {
				out["notready"]++
			}
		}
		return out
	})
	m.CountFunc("berth_containers", "Containers by state.", "state", func() map[string]float64 {
		out := map[string]float64{string(container.StateCreated): 0, string(container.StateRunning): 0, string(container.StateExited): 0}
		for _, c := range containers.List() {
			out[string(c.State)]++
		}
		return out
	})
	m.Registry.MustRegister(shimGauge(containers))
	m.CounterFunc("berth_container_log_write_errors_total",
		"CRI log records the node's berth-shim monitor could not write in full (a full or failing disk), by container.",
		"container", func() map[string]float64 { return logWriteErrors(containers) })
}

// logWriteErrorsBudget bounds one scrape's questions to the monitor.
const logWriteErrorsBudget = 2 * time.Second

// logWriteErrors asks the node's monitor how many CRI log records it
// could not write for each container: one short RPC per container the
// monitor still holds, at scrape time only.
func logWriteErrors(containers *container.Store) map[string]float64 {
	ctx, cancel := context.WithTimeout(context.Background(), logWriteErrorsBudget)
	defer cancel()
	out := map[string]float64{}
	for _, c := range containers.List() {
		if st, err := containers.ShimState(ctx, c.ID); err == nil {
			out[c.ID] = float64(st.LogWriteErrors)
		}
	}
	return out
}

// registerLazyCounts adds the lazy-pull metrics (decision 3600).
func registerLazyCounts(m *metrics.Metrics, images *image.Store) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "berth_lazy_chunk_verify_failures_total",
		Help: "Chunks of lazily pulled layers that did not match their TOC digest (each read failed with EIO and the image was removed).",
	}, func() float64 { return float64(images.LazyCorruptChunks()) }))
}

func shimGauge(containers *container.Store) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "berth_shims", Help: "Pods the node's berth-shim monitor serves (pods with containers); one keeper and one monitor run for all of them.",
	}, func() float64 {
		pods := map[string]bool{}
		for _, c := range containers.List() {
			pods[c.PodID] = true
		}
		return float64(len(pods))
	})
}
