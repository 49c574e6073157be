package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/metrics"
	"github.com/berthcri/berth/internal/sandbox"
)

// registerObjectCounts adds the scrape-time gauges over the stores: pods
// and containers by state, and running shims (one per pod that has
// containers; a shim exits with its pod's last container).
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
}

func shimGauge(containers *container.Store) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "berth_shims", Help: "Running berth-shim processes (pods with containers).",
	}, func() float64 {
		pods := map[string]bool{}
		for _, c := range containers.List() {
			pods[c.PodID] = true
		}
		return float64(len(pods))
	})
}
