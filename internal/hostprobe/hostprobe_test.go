package hostprobe

import (
	"testing"

	"github.com/berthcri/berth/internal/fault"
)

// The one seam where swap accounting is decided: an armed
// fault.HostFailSwapAccounting makes the probe find none, and changes
// nothing else it reads.
func TestProbeSwapAccountingFault(t *testing.T) {
	plain, err := Probe(nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := fault.New([]fault.Point{fault.HostFailSwapAccounting}, nil)
	if err != nil {
		t.Fatal(err)
	}
	armed, err := Probe(in)
	if err != nil {
		t.Fatal(err)
	}
	if armed.Spec.SwapAccounting {
		t.Fatal("swap accounting found with fail-swap-accounting armed")
	}
	got, want := *armed.Spec, *plain.Spec
	got.SwapAccounting, want.SwapAccounting = false, false
	if got.CgroupV2 != want.CgroupV2 || got.Hostname != want.Hostname || len(got.AllCapabilities) != len(want.AllCapabilities) || armed.OOMScoreAdj != plain.OOMScoreAdj {
		t.Fatalf("armed probe %+v, plain %+v: more than swap accounting changed", got, want)
	}
}
