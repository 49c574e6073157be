package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkImageLeases measures the image store alone (no runc, no
// shims): Acquire, which every CreateContainer calls, with leaseBacklog
// leases held, once on its own and once while parallelRemovals other
// owners Release theirs, as RemoveContainer does (the Acquire starts once
// the first Release has). Only the store's own
// locking and I/O separate the two. It uses only Open, Pull, Acquire and
// Release, so the same file measures an older tree for a before/after.
func BenchmarkImageLeases(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("unpack needs root (chown, mknod, trusted xattrs)")
	}
	const leaseBacklog, runs, warmup = 100, 50, 3
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	ctx := context.Background()
	s, err := image.Open(image.Options{Root: filepath.Join(b.TempDir(), "images")})
	if err != nil {
		b.Fatal(err)
	}
	ref := reg.Ref(testimages.BusyboxRef)
	if _, err := s.Pull(ctx, ref, nil); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < leaseBacklog; i++ {
		if _, _, err := s.Acquire(ctx, ref, fmt.Sprintf("held-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	alone := Series{Name: fmt.Sprintf("Acquire (%d leases held)", leaseBacklog)}
	busy := Series{Name: fmt.Sprintf("Acquire (%d leases held, %d Releases in parallel)", leaseBacklog, parallelRemovals)}
	release := Series{Name: fmt.Sprintf("Release (%d in parallel, each)", parallelRemovals)}
	acquire := func(owner string) time.Duration {
		t0 := time.Now()
		if _, _, err := s.Acquire(ctx, ref, owner); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for i := 0; i < warmup+runs; i++ {
		victims := make([]string, parallelRemovals)
		for v := range victims {
			victims[v] = fmt.Sprintf("victim-%d-%d", i, v)
			acquire(victims[v])
		}
		dAlone := acquire(fmt.Sprintf("alone-%d", i))
		var wg sync.WaitGroup
		var mu sync.Mutex
		var rel []time.Duration
		started := make(chan struct{}, len(victims))
		for _, owner := range victims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				started <- struct{}{}
				t0 := time.Now()
				if err := s.Release(owner); err != nil {
					b.Error(err)
				}
				mu.Lock()
				rel = append(rel, time.Since(t0))
				mu.Unlock()
			}()
		}
		<-started // the removals are under way
		dBusy := acquire(fmt.Sprintf("probe-%d", i))
		wg.Wait()
		for _, owner := range []string{fmt.Sprintf("alone-%d", i), fmt.Sprintf("probe-%d", i)} {
			if err := s.Release(owner); err != nil {
				b.Fatal(err)
			}
		}
		if i >= warmup {
			alone.Samples = append(alone.Samples, dAlone)
			busy.Samples = append(busy.Samples, dBusy)
			release.Samples = append(release.Samples, rel...)
		}
	}
	if err := Report(os.Stdout, "image_leases", alone, busy, release); err != nil {
		b.Fatal(err)
	}
}
