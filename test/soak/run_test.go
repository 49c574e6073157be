package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Baseline bounds, outside any fault: a pod's start (manifest to Ready)
// on a churning full node, and a Ready pod's lapse (two periods of its
// HTTP readiness probe).
const (
	startBound    = 2 * time.Minute
	notReadyBound = 10 * time.Second
)

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// runSoak fills the node, then churns and injects faults for the run's
// minutes while the observers measure; it returns the report so far
// (teardown adds to it).
func runSoak(t *testing.T, n *node, p params) *report {
	sub := func(k uint64) *rand.Rand { return rand.New(rand.NewPCG(p.Seed, k)) }
	w := newWorkload(n, sub(1))
	o := newObservers(n, w)
	f := &faulter{n: n, w: w, rng: sub(2)}
	r := newReport(p, n, w, o)
	r.sample("start (no pod)")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			w.poll()
			sleepCtx(ctx, 2*time.Second)
		}
	}()

	fillStart := time.Now()
	if err := w.fill(); err != nil {
		t.Fatal(err)
	}
	fillBound := max(5*time.Minute, time.Duration(p.Pods)*3*time.Second)
	for {
		ready, live := w.readyCount()
		if ready == live {
			break
		}
		if time.Since(fillStart) > fillBound {
			t.Fatalf("%d of %d pods Ready %s after the node was filled", ready, live, fillBound)
		}
		time.Sleep(time.Second)
	}
	r.FillS = time.Since(fillStart).Seconds()
	r.fillDone = time.Now()
	t.Logf("soak: %d pods Ready in %.0f s; churn and faults for %g minutes", p.Pods, r.FillS, p.Minutes)

	end := time.Now().Add(time.Duration(p.Minutes * float64(time.Minute)))
	wg.Add(3)
	go func() { defer wg.Done(); o.criLoop(ctx, sub(3)) }()
	go func() { defer wg.Done(); o.kubeletLoop(ctx) }()
	go func() {
		defer wg.Done()
		if p.Churn == 0 {
			return
		}
		every := time.Minute / time.Duration(p.Churn)
		for {
			sleepCtx(ctx, every)
			if ctx.Err() != nil {
				return
			}
			if _, err := w.replace(); err != nil {
				r.addFinding(fmt.Errorf("churn: %w", err))
			}
		}
	}()

	time.Sleep(min(p.Warmup, time.Until(end)))
	r.sample("after warm-up")

	// Faults in rounds, each a seeded shuffle of the list; the first
	// round always runs whole (a short run overruns its minutes rather
	// than leave a fault out), later ones while the run lasts.
	order := append([]string(nil), p.Faults...)
	f.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	firstRound := len(order)
	for len(p.Faults) > 0 {
		gap := p.Gap/2 + time.Duration(f.rng.Int64N(int64(p.Gap)+1))
		if firstRound == 0 && time.Now().Add(gap).After(end) {
			break
		}
		time.Sleep(gap)
		if len(order) == 0 {
			order = append([]string(nil), p.Faults...)
			f.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		name := order[0]
		order = order[1:]
		firstRound = max(0, firstRound-1)
		r.addFault(inject(t, f, o, name))
	}
	if d := time.Until(end); d > 0 {
		time.Sleep(d)
	}
	// The end sample once every pod is Ready again (or a bound passed).
	settle := time.Now()
	for time.Since(settle) < time.Duration(float64(startBound)*p.BoundScale) {
		if ready, live := w.readyCount(); ready == live {
			break
		}
		time.Sleep(time.Second)
	}
	r.sample("end")
	r.ended = time.Now()
	cancel()
	wg.Wait()
	w.finish(time.Now())
	return r
}

// inject runs one fault and waits for the node to recover: every pod
// Ready at its start that still runs is Ready again, berthd serves and
// (while pods run) a keeper and monitor live; up to three times its bound.
func inject(t *testing.T, f *faulter, o *observers, name string) faultRecord {
	kind := faultKinds[name]
	bound := time.Duration(float64(kind.Bound) * f.n.p.BoundScale)
	rec := faultRecord{Kind: name, At: time.Now(), BoundS: bound.Seconds()}
	readyBefore := f.w.readyNames()
	o.faultActive.Store(true)
	defer o.faultActive.Store(false)
	note, finding := kind.Run(f)
	rec.end = time.Now()
	rec.DurationS = rec.end.Sub(rec.At).Seconds()
	rec.Note = note
	if finding != nil {
		rec.Finding = finding.Error()
	}
	select {
	case <-f.n.d.Exited():
		// berthd died outside the fault's own kills: a finding, and the
		// soak goes on with a new one.
		rec.Finding += fmt.Sprintf("; berthd exited after the fault: %v", f.n.d.ExitErr())
		if err := f.n.restartBerthd(); err != nil {
			t.Fatalf("restart berthd after %s: %v", name, err)
		}
	default:
	}
	deadline := rec.end.Add(3 * bound)
	for {
		if f.w.allReadyOf(readyBefore) && f.n.waitServing(0) == nil && f.n.shimsServe() {
			rec.RecoveredS = time.Since(rec.end).Seconds()
			rec.Recovered = true
			break
		}
		if time.Now().After(deadline) {
			rec.RecoveredS = time.Since(rec.end).Seconds()
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("soak: fault %s at %s: %s; recovered in %.1f s (bound %.0f s)%s", name, rec.At.Format(time.TimeOnly), rec.Note,
		rec.RecoveredS, rec.BoundS, map[bool]string{true: "", false: ": NOT RECOVERED"}[rec.Recovered])
	if rec.Finding != "" {
		t.Logf("soak: fault %s: finding: %s", name, rec.Finding)
	}
	return rec
}
