package image

import (
	"context"
	"testing"
	"time"
)

// waitQuiet waits for the quiet period after its own start, longer while
// reads go on, and no longer than its limit; a cancelled context ends it
// with false; quiet 0 does not wait.
func TestLazyWaitQuiet(t *testing.T) {
	// Reads come every 50 ms; a goroutine of the test would have to stall
	// for the whole quiet period for it to fail on a loaded machine.
	const quiet = time.Second
	ctx := context.Background()
	t.Run("quiet from its start", func(t *testing.T) {
		t.Parallel()
		var z lazyLayers
		start := time.Now()
		if !z.waitQuiet(ctx, quiet, time.Minute) {
			t.Fatal("waitQuiet: false without a cancel")
		}
		if took := time.Since(start); took < quiet {
			t.Fatalf("returned after %v, before the quiet period %v", took, quiet)
		}
	})
	t.Run("reads push it back", func(t *testing.T) {
		t.Parallel()
		var z lazyLayers
		readsEnd := reading(&z, 10, nil)
		if !z.waitQuiet(ctx, quiet, time.Minute) {
			t.Fatal("waitQuiet: false without a cancel")
		}
		var end time.Time
		select {
		case end = <-readsEnd:
		default:
			t.Fatal("returned while reads went on")
		}
		if since := time.Since(end); since < quiet-50*time.Millisecond {
			t.Fatalf("returned %v after the last read, before the quiet period %v", since, quiet)
		}
	})
	t.Run("bounded while reads never stop", func(t *testing.T) {
		t.Parallel()
		var z lazyLayers
		stop := make(chan struct{})
		defer close(stop)
		reading(&z, -1, stop)
		const limit = 2 * time.Second
		start := time.Now()
		if !z.waitQuiet(ctx, quiet, limit) {
			t.Fatal("waitQuiet: false without a cancel")
		}
		if took := time.Since(start); took < limit {
			t.Fatalf("returned after %v, before its limit %v, though reads went on", took, limit)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		t.Parallel()
		var z lazyLayers
		cctx, cancel := context.WithCancel(ctx)
		go func() { time.Sleep(50 * time.Millisecond); cancel() }()
		if z.waitQuiet(cctx, time.Hour, time.Hour) {
			t.Fatal("waitQuiet: true after its context was cancelled")
		}
	})
	t.Run("no quiet period", func(t *testing.T) {
		t.Parallel()
		var z lazyLayers
		z.touch()
		start := time.Now()
		if !z.waitQuiet(ctx, 0, time.Minute) || time.Since(start) > time.Second {
			t.Fatal("quiet 0 waited or failed")
		}
	})
}

// reading marks a read of z every 50 ms, n times (until stop closes when
// n < 0), then sends the time of its last read.
func reading(z *lazyLayers, n int, stop <-chan struct{}) <-chan time.Time {
	last := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; n < 0 || i < n; i++ {
			select {
			case <-tick.C:
				z.touch()
			case <-stop:
				return
			}
		}
		last <- time.Now()
	}()
	return last
}
