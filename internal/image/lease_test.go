package image

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// pulledStore opens a store in a temp dir and pulls the 4-layer image.
func pulledStore(t *testing.T, opts Options) (*Store, *Image, string) {
	t.Helper()
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	opts.Root = filepath.Join(t.TempDir(), "images")
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ref := reg.Ref(testimages.MultiLayerRef)
	img, err := s.Pull(context.Background(), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, img, ref
}

func layersPresent(t *testing.T, s *Store, img *Image) int {
	t.Helper()
	n := 0
	for _, c := range img.ChainIDs {
		if _, err := os.Stat(s.LayerDiffDir(c)); err == nil {
			n++
		}
	}
	return n
}

// TestLeaseIsOnDiskWhenAcquireReturns: a crash right after Acquire (the
// container's record is written next) must find the lease.
func TestLeaseIsOnDiskWhenAcquireReturns(t *testing.T) {
	s, img, ref := pulledStore(t, Options{})
	if _, _, err := s.Acquire(context.Background(), ref, "ctr1"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(s.Dir(), "leases", "ctr1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var l lease
	if err := json.Unmarshal(data, &l); err != nil || l.Owner != "ctr1" || len(l.ChainIDs) != len(img.ChainIDs) {
		t.Fatalf("lease file %s: %v", data, err)
	}
	// A second store on the same dir is what a restarted daemon opens.
	again, err := Open(Options{Root: s.Dir()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if owners, _ := again.Owners(); len(owners) != 1 || owners[0] != "ctr1" {
		t.Fatalf("owners after reopen: %v", owners)
	}
}

// TestFailedLeaseWriteHoldsNothing: when the lease file cannot be written,
// Acquire fails and neither memory nor disk keeps a lease.
func TestFailedLeaseWriteHoldsNothing(t *testing.T) {
	in, err := fault.New([]fault.Point{fault.ImageFailLeaseWrite}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, img, ref := pulledStore(t, Options{Faults: in})
	if _, _, err := s.Acquire(context.Background(), ref, "ctr1"); !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("acquire with a failing lease write: %v", err)
	}
	if owners, _ := s.Owners(); len(owners) != 0 {
		t.Fatalf("owners after a failed acquire: %v", owners)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "leases", "ctr1.json")); !os.IsNotExist(err) {
		t.Fatalf("lease file after a failed acquire: %v", err)
	}
	if err := s.Remove(ref); err != nil {
		t.Fatal(err)
	}
	if n := layersPresent(t, s, img); n != 0 {
		t.Fatalf("%d layers kept by a lease that was never written", n)
	}
}

// TestUnreadableLeaseKeepsEveryLayer: a lease file that cannot be parsed
// at start names no layers, so none may be freed until it is released.
func TestUnreadableLeaseKeepsEveryLayer(t *testing.T) {
	s, img, ref := pulledStore(t, Options{})
	if _, _, err := s.Acquire(context.Background(), ref, "ctr1"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.WriteFile(filepath.Join(s.Dir(), "leases", "ctr1.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Options{Root: s.Dir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Remove(ref); err != nil {
		t.Fatal(err)
	}
	if n := layersPresent(t, s, img); n != len(img.ChainIDs) {
		t.Fatalf("%d of %d layers left while an unreadable lease exists", n, len(img.ChainIDs))
	}
	if err := s.Release("ctr1"); err != nil {
		t.Fatal(err)
	}
	s.WaitGC()
	if n := layersPresent(t, s, img); n != 0 {
		t.Fatalf("%d layers left after the unreadable lease was released", n)
	}
}

// TestCollectionKeepsWhatAPullMarked: a pass that listed the store before
// a pull marked a layer it is about to reuse must not free that layer; it
// decides under the lock the pull marks under.
func TestCollectionKeepsWhatAPullMarked(t *testing.T) {
	s, img, ref := pulledStore(t, Options{})
	listed := make(chan struct{})
	resume := make(chan struct{})
	s.gc.listed = func() {
		s.gc.listed = nil // only the first pass stops
		close(listed)
		<-resume
	}
	if removed, err := s.removeMeta(ref); err != nil || !removed {
		t.Fatal(removed, err)
	}
	pass := s.requestGC()
	<-listed
	// The pass has listed the layers as unused. Now a pull of the same
	// image marks them, as commit does before it looks for them on disk.
	keys := append([]string(nil), img.ChainIDs...)
	s.refs.mark(keys, 1)
	close(resume)
	<-pass
	if n := layersPresent(t, s, img); n != len(img.ChainIDs) {
		t.Fatalf("the pass freed %d layers a pull had marked", len(img.ChainIDs)-n)
	}
	s.refs.mark(keys, -1)
	s.WaitGC()
	if n := layersPresent(t, s, img); n != 0 {
		t.Fatalf("%d unused layers left once the pull let go", n)
	}
}

// TestRequestsDuringAPassGetTheNextPass: a pass may have listed the store
// before a release; whoever asks while it runs is served by one more pass
// (shared by all who asked meanwhile), never by the running one.
func TestRequestsDuringAPassGetTheNextPass(t *testing.T) {
	s, img, ref := pulledStore(t, Options{})
	ctx := context.Background()
	for _, owner := range []string{"a", "b", "c"} {
		if _, _, err := s.Acquire(ctx, ref, owner); err != nil {
			t.Fatal(err)
		}
	}
	if removed, err := s.removeMeta(ref); err != nil || !removed {
		t.Fatal(removed, err)
	}
	passes := 0
	listed := make(chan struct{}, 10)
	resume := make(chan struct{})
	s.gc.listed = func() {
		passes++
		listed <- struct{}{}
		<-resume
	}
	first := s.requestGC()
	<-listed
	// While the first pass is stopped after its listing, the leases go.
	for _, owner := range []string{"a", "b", "c"} {
		if err := s.Release(owner); err != nil {
			t.Fatal(err)
		}
	}
	waited := s.requestGC()
	if waited == first {
		t.Fatal("a request during a pass was handed the running pass")
	}
	close(resume)
	<-first
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("the next pass never ended")
	}
	if n := layersPresent(t, s, img); n != 0 {
		t.Fatalf("%d layers left after the pass that followed the releases", n)
	}
	if passes != 2 {
		t.Fatalf("%d passes for one running and four queued requests, want 2", passes)
	}
}

// TestLeasesDoNotWaitForCollection: while a pass is stopped (after its
// listing, before it decides), creates and removals (Acquire, Release)
// go on: no Release collects under the lock every Acquire takes
// (decision 1500).
func TestLeasesDoNotWaitForCollection(t *testing.T) {
	s, img, ref := pulledStore(t, Options{})
	ctx := context.Background()
	listed := make(chan struct{})
	resume := make(chan struct{})
	s.gc.listed = func() {
		s.gc.listed = nil
		close(listed)
		<-resume
	}
	pass := s.requestGC()
	<-listed
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 20; i++ {
			owner := "c" + string(rune('a'+i))
			if _, _, err := s.Acquire(ctx, ref, owner); err != nil {
				done <- err
				return
			}
			if err := s.Release(owner); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Acquire/Release waited for a collection pass")
	}
	close(resume)
	<-pass
	s.WaitGC()
	if n := layersPresent(t, s, img); n != len(img.ChainIDs) {
		t.Fatalf("the image's own layers went: %d of %d left", n, len(img.ChainIDs))
	}
}
