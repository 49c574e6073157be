package monitor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// A node holds at most proto.MaxLazyLayers lazy layers: each is a
// descriptor in the keeper for as long as it lives. One more is
// FailedPrecondition and its descriptor is closed, not kept; a layer
// already held may still be handed again (it replaces its connection).
func TestLazyHoldBoundedAtMaxLazyLayers(t *testing.T) {
	fuse := func() int {
		fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Skipf("open /dev/fuse: %v", err)
		}
		return fd
	}
	m := New(filepath.Join(t.TempDir(), ".node"), t.Logf, -1)
	for i := range proto.MaxLazyLayers {
		m.lazy[fmt.Sprintf("sha256:%064x", i)] = fmt.Sprintf("/var/lib/berth/layers/%d", i)
	}
	before := fuseFdsOfSelf(t)
	over := "sha256:" + strings.Repeat("f", 64)
	if err := m.lazyHold(over, "/var/lib/berth/layers/f", []int{fuse()}, false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("hold of layer %d: %v, want FailedPrecondition", proto.MaxLazyLayers+1, err)
	}
	if got := fuseFdsOfSelf(t); got != before {
		t.Errorf("the refused hold left its descriptor open: %d /dev/fuse fds, %d before", got, before)
	}
	if ids := m.lazyIDs(); len(ids) != proto.MaxLazyLayers {
		t.Errorf("held %d layers after the refused hold, want %d", len(ids), proto.MaxLazyLayers)
	}
	// A layer already held is not one more.
	again := fmt.Sprintf("sha256:%064x", 7)
	if err := m.lazyHold(again, "/var/lib/berth/layers/7", []int{fuse()}, false); err != nil {
		t.Fatalf("hold again of a held layer at the bound: %v", err)
	}
	if got := fuseFdsOfSelf(t); got != before {
		t.Errorf("%d /dev/fuse fds after the hold again, %d before (the monitor keeps none: the keeper has its own)", got, before)
	}
}

// fuseFdsOfSelf counts this process's descriptors open on /dev/fuse.
func fuseFdsOfSelf(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == "/dev/fuse" {
			n++
		}
	}
	return n
}
