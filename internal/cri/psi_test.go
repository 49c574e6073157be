package cri

import (
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/stats"
)

// PSI read from a real-shaped cgroup v2 tree reaches the CRI stats and the
// cAdvisor-named metrics; a cgroup without *.pressure files reports none
// (absent, not zero).
func TestPSIInStatsAndMetrics(t *testing.T) {
	const root = "../stats/testdata/cgroupv2"
	ctr, err := stats.ReadV2(root, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-berth-ctr1.scope")
	if err != nil {
		t.Fatal(err)
	}
	smp := stats.Sample{Usage: ctr}
	cpu, mem, _ := cpuMemSwap(smp)
	io := ioUsage(smp)
	if got := cpu.GetPsi().GetFull(); got.GetTotal() != 1300000*1000 || got.GetAvg10() != 0.5 || got.GetAvg300() != 0.05 {
		t.Fatalf("cpu psi %+v", cpu.GetPsi())
	}
	if got := mem.GetPsi().GetSome(); got.GetTotal() != 88000000*1000 || got.GetAvg60() != 6.1 {
		t.Fatalf("memory psi %+v", mem.GetPsi())
	}
	if io.GetTimestamp() == 0 || io.GetPsi().GetFull().GetTotal() != 7000*1000 {
		t.Fatalf("io %+v", io)
	}

	m := &metricSet{ts: 1, labels: []string{"pod", "ns", "c", "id", "img"}}
	m.addPressure(ctr)
	got := map[string]uint64{}
	for _, x := range m.out {
		if x.MetricType != runtime.MetricType_COUNTER || len(x.LabelValues) != 5 {
			t.Fatalf("metric %+v", x)
		}
		got[x.Name] = x.Value.GetValue()
	}
	want := map[string]uint64{
		"container_pressure_cpu_waiting_seconds_total": 4, "container_pressure_cpu_stalled_seconds_total": 1,
		"container_pressure_memory_waiting_seconds_total": 88, "container_pressure_memory_stalled_seconds_total": 71,
		"container_pressure_io_waiting_seconds_total": 0, "container_pressure_io_stalled_seconds_total": 0,
	}
	if len(got) != len(want) {
		t.Fatalf("metrics %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s = %d, want %d", k, got[k], v)
		}
	}
	for _, d := range metricDescriptors {
		delete(want, d.Name)
	}
	if len(want) != 0 {
		t.Fatalf("no descriptor for %v", want)
	}

	pod, err := stats.ReadV2(root, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice")
	if err != nil {
		t.Fatal(err)
	}
	cpu, mem, _ = cpuMemSwap(stats.Sample{Usage: pod})
	m = &metricSet{}
	m.addPressure(pod)
	if cpu.Psi != nil || mem.Psi != nil || ioUsage(stats.Sample{Usage: pod}) != nil || len(m.out) != 0 {
		t.Fatalf("pressure reported without *.pressure files: %v %v %v", cpu.Psi, mem.Psi, m.out)
	}
}
