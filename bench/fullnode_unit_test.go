package bench

import (
	"math"
	"strings"
	"testing"
)

const sampleMetrics = `# HELP kubelet_pod_start_duration_seconds x
# TYPE kubelet_pod_start_duration_seconds histogram
kubelet_pod_start_duration_seconds_bucket{le="0.5"} 0
kubelet_pod_start_duration_seconds_bucket{le="1"} 10
kubelet_pod_start_duration_seconds_bucket{le="2"} 90
kubelet_pod_start_duration_seconds_bucket{le="+Inf"} 100
kubelet_pod_start_duration_seconds_sum 150
kubelet_pod_start_duration_seconds_count 100
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.1"} 1
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="+Inf"} 2
kubelet_runtime_operations_duration_seconds_sum{operation_type="run_podsandbox"} 0.5
kubelet_runtime_operations_duration_seconds_count{operation_type="run_podsandbox"} 2
kubelet_runtime_operations_duration_seconds_bucket{operation_type="start_container",le="0.1"} 3
kubelet_runtime_operations_duration_seconds_bucket{operation_type="start_container",le="+Inf"} 3
kubelet_runtime_operations_duration_seconds_sum{operation_type="start_container"} 0.03
kubelet_runtime_operations_duration_seconds_count{operation_type="start_container"} 3
`

func TestParseHistogram(t *testing.T) {
	h := ParseHistogram(sampleMetrics, "kubelet_pod_start_duration_seconds")
	if h.Count != 100 || h.Sum != 150 || len(h.Bounds) != 4 {
		t.Fatalf("parsed %+v", h)
	}
	// 50th of 100: in (1, 2], 40 of its 80 → 1.5.
	if q := h.Quantile(0.5); math.Abs(q-1.5) > 1e-9 {
		t.Errorf("p50 = %v, want 1.5", q)
	}
	// 95th falls in +Inf: the highest finite bound.
	if q := h.Quantile(0.95); q != 2 {
		t.Errorf("p95 = %v, want 2", q)
	}
	if m := h.Mean(); m != 1.5 {
		t.Errorf("mean = %v", m)
	}
	if q := ParseHistogram("", "x").Quantile(0.5); !math.IsNaN(q) {
		t.Errorf("empty p50 = %v, want NaN", q)
	}
	ops := runtimeOps(sampleMetrics)
	if len(ops) != 2 || ops["run_podsandbox"].Count != 2 || math.Abs(ops["run_podsandbox"].MeanMs-250) > 1e-9 || math.Abs(ops["start_container"].MeanMs-10) > 1e-9 {
		t.Errorf("ops = %+v", ops)
	}
}

func TestFullNodeManifest(t *testing.T) {
	two := 0
	for i := range FullNodePods {
		name, m := FullNodeManifest(i, "reg/httpd:1", "reg/bb:1")
		if !strings.Contains(m, "name: "+name) || strings.Contains(m, "{{") {
			t.Fatalf("pod %d:\n%s", i, m)
		}
		if strings.Contains(m, "name: sidecar") {
			two++
		}
	}
	if two != FullNodePods/3 {
		t.Errorf("%d pods with two containers, want %d", two, FullNodePods/3)
	}
}
