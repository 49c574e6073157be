// Package soak is `make soak` (issue 35, decision 3500): a real kubelet
// (kubelettest, standalone, static pods) runs a full node of pods on a
// private berthd for SOAK_MINUTES minutes of churn, probes, log and stats
// reads and faults at seeded random intervals (kill -9 of berthd, of the
// keeper, of the monitor; the monitor stopped for 30 s; berthd killed in
// a multi-layer pull and crashed in an unpack; a CNI ADD that fails once;
// the root's disk nearly full during a pull), then tears the node down
// and checks that nothing is left. It reports a markdown table and a JSON
// file (docs/reliability.md, "Soak"). Without SOAK_MINUTES it skips at
// once: `make test` never runs it.
package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// params are the soak's knobs, from the environment (Makefile: make soak
// SOAK_MINUTES=60 ...).
type params struct {
	// Minutes of churn and faults once the node is full (SOAK_MINUTES).
	Minutes float64
	// Pods on the node (SOAK_PODS, default 110: the kubelet's maxPods).
	Pods int
	// Churn is how many pods are replaced a minute (SOAK_CHURN, default
	// 10 at 110 pods, scaled down with the pods).
	Churn int
	// Seed of every random choice (SOAK_SEED; default: the clock).
	Seed uint64
	// Faults run, in a seeded order, each once before any repeats
	// (SOAK_FAULTS, comma-separated; default: all of faultKinds).
	Faults []string
	// Gap is the mean wait between a fault's recovery and the next
	// (SOAK_FAULT_GAP seconds; default: the fault phase over twice the
	// number of faults, within 10 s..90 s). Each wait is drawn in
	// [Gap/2, 3·Gap/2].
	Gap time.Duration
	// Warmup is churn without faults before the "after warm-up" sample
	// (min(5 min, a tenth of the run)).
	Warmup time.Duration
	// BoundScale multiplies every recovery bound (SOAK_BOUND_SCALE,
	// default 1): the bounds are a real node's; an emulated guest (TCG,
	// ~10× slower) needs more.
	BoundScale float64
	// RootMiB is the size of the loop-mounted filesystem that is
	// berthd's --root (SOAK_ROOT_MIB, default 1024).
	RootMiB int
	// Out is where the JSON report goes (SOAK_OUT, default
	// out/soak/<time> in the checkout).
	Out string
}

func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q: want a whole number ≥ 0", name, v)
	}
	return n, nil
}

func loadParams() (params, error) {
	var p params
	m, err := strconv.ParseFloat(os.Getenv("SOAK_MINUTES"), 64)
	if err != nil || m <= 0 {
		return p, fmt.Errorf("SOAK_MINUTES=%q: want minutes > 0", os.Getenv("SOAK_MINUTES"))
	}
	p.Minutes = m
	if p.Pods, err = envInt("SOAK_PODS", 110); err != nil {
		return p, err
	}
	if p.Pods < 1 {
		return p, fmt.Errorf("SOAK_PODS must be at least 1")
	}
	if p.Churn, err = envInt("SOAK_CHURN", (p.Pods+10)/11); err != nil {
		return p, err
	}
	seed, err := envInt("SOAK_SEED", int(time.Now().UnixNano()%1e9))
	if err != nil {
		return p, err
	}
	p.Seed = uint64(seed)
	p.Faults = faultNames()
	if v := os.Getenv("SOAK_FAULTS"); v != "" {
		p.Faults = nil
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			if _, ok := faultKinds[f]; !ok {
				return p, fmt.Errorf("SOAK_FAULTS: unknown fault %q (known: %s)", f, strings.Join(faultNames(), ", "))
			}
			p.Faults = append(p.Faults, f)
		}
	}
	run := time.Duration(m * float64(time.Minute))
	p.Warmup = min(5*time.Minute, run/10)
	gap, err := envInt("SOAK_FAULT_GAP", 0)
	if err != nil {
		return p, err
	}
	p.Gap = time.Duration(gap) * time.Second
	if gap == 0 && len(p.Faults) > 0 {
		p.Gap = min(90*time.Second, max(10*time.Second, (run-p.Warmup)/time.Duration(2*len(p.Faults))))
	}
	p.BoundScale = 1
	if v := os.Getenv("SOAK_BOUND_SCALE"); v != "" {
		if p.BoundScale, err = strconv.ParseFloat(v, 64); err != nil || p.BoundScale < 1 {
			return p, fmt.Errorf("SOAK_BOUND_SCALE=%q: want a factor ≥ 1", v)
		}
	}
	if p.RootMiB, err = envInt("SOAK_ROOT_MIB", 1024); err != nil {
		return p, err
	}
	if p.RootMiB < 256 {
		return p, fmt.Errorf("SOAK_ROOT_MIB must be at least 256")
	}
	p.Out = os.Getenv("SOAK_OUT")
	if p.Out == "" {
		_, file, _, _ := runtime.Caller(0)
		p.Out = filepath.Join(filepath.Dir(file), "..", "..", "out", "soak", time.Now().UTC().Format("20060102T150405Z"))
	}
	return p, nil
}

// TestSoak is the whole soak: node up, full, churn and faults for the
// run's minutes, teardown, leak checks, report. It fails on a container
// restart the churn did not cause, a pod not Ready past its fault's
// bound, anything left after teardown, or disk accounting that does not
// match; resource growth past 10% is reported, not failed (a berthd
// killed by a fault starts small again).
func TestSoak(t *testing.T) {
	if os.Getenv("SOAK_MINUTES") == "" {
		t.Skip("the soak runs only with SOAK_MINUTES set (make soak)")
	}
	p, err := loadParams()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("soak: seed %d (SOAK_SEED=%d repeats its choices), %g minutes, %d pods, %d replaced a minute, faults %s every ~%s",
		p.Seed, p.Seed, p.Minutes, p.Pods, p.Churn, strings.Join(p.Faults, ","), p.Gap)
	n := startNode(t, p)
	r := runSoak(t, n, p)
	teardown(t, n, r)
	r.finish()
	if err := r.write(os.Stdout, p.Out); err != nil {
		t.Errorf("write the report: %v", err)
	}
	for _, miss := range r.failures() {
		t.Error(miss)
	}
}
