package integration

import (
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/containerd/cgroups/v3"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// On a node whose kernel exposes no per-cgroup pressure stall information
// (cgroup v1, as here), stats and metrics leave PSI out rather than
// report zeros; the descriptors still name the cAdvisor metrics. (Values
// on cgroup v2 are tested on real-shaped fixtures: internal/stats and
// internal/cri TestPSIInStatsAndMetrics.)
func TestPSIAbsentWhereTheKernelHasNone(t *testing.T) {
	t.Parallel()
	if cgroups.Mode() == cgroups.Unified {
		t.Skip("this node has cgroup v2: pressure files may exist")
	}
	e := newCtrEnv(t)
	id := e.run(e.config("psi", "sleep", "3600"))

	cs := containerStats(t, e.d, id)
	if cs.GetCpu() == nil || cs.GetMemory() == nil {
		t.Fatalf("stats without cpu or memory: %v", cs)
	}
	if cs.GetCpu().GetPsi() != nil || cs.GetMemory().GetPsi() != nil || cs.GetIo() != nil {
		t.Fatalf("PSI reported on a node without it: cpu %v memory %v io %v", cs.GetCpu().GetPsi(), cs.GetMemory().GetPsi(), cs.GetIo())
	}
	ps := podStats(t, e.d, e.pod)
	if l := ps.GetLinux(); l.GetCpu().GetPsi() != nil || l.GetMemory().GetPsi() != nil || l.GetIo() != nil {
		t.Fatalf("pod PSI reported on a node without it: %v", l)
	}

	pod, ctr := podMetricsOf(t, e.d, e.pod, id)
	for _, level := range []map[string][]*criapi.Metric{pod, ctr} {
		for name := range level {
			if strings.HasPrefix(name, "container_pressure_") {
				t.Fatalf("metric %s sent on a node without PSI", name)
			}
		}
	}
	descs, err := e.d.Runtime.ListMetricDescriptors(berthdtest.Ctx(t), &criapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range descs.Descriptors {
		if strings.HasPrefix(d.Name, "container_pressure_") {
			n++
		}
	}
	if n != 6 {
		t.Fatalf("%d pressure descriptors, want 6", n)
	}
}
