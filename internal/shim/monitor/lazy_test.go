package monitor

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

// A node that holds a lazy layer is not idle (decision 3600): the idle
// timeout, its last pod's end and a shutdown leave it; the drop of its
// last layer ends it, as the end of its last pod does. (Else an idle
// monitor exits and its keeper, which holds the layer, restarts it every
// idleExitAfter.)
func TestIdleMonitorStaysForItsLazyLayers(t *testing.T) {
	fuse := func() int {
		fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Skipf("open /dev/fuse: %v", err)
		}
		return fd
	}
	id := "sha256:" + strings.Repeat("e", 64)
	longAgo := time.Now().Add(-2 * idleExitAfter)

	// The control: a node as old, with nothing, ends at its housekeeping.
	idle := New(filepath.Join(t.TempDir(), ".node"), t.Logf, -1)
	idle.started = longAgo
	idle.housekeep()
	if !idle.isClosing() {
		t.Fatal("an idle node past idleExitAfter did not end")
	}

	p := testPod(t)
	m := p.mon
	m.started = longAgo
	if err := m.lazyHold(id, "/var/lib/berth/layers/e", []int{fuse()}, false); err != nil {
		t.Fatal(err)
	}
	m.housekeep()
	m.podGone(p)
	if m.isClosing() {
		t.Fatal("a node holding a lazy layer ended idle or with its last pod")
	}
	if err := m.shutdownIfIdle(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("shutdown of a node holding a layer: %v, want FailedPrecondition", err)
	}
	if ids := m.lazyIDs(); len(ids) != 1 || ids[0] != id {
		t.Fatalf("held: %v", ids)
	}
	if err := m.lazyDrop(id); err != nil {
		t.Fatal(err)
	}
	if !m.isClosing() {
		t.Fatal("the drop of the last layer of a node with no pod did not end it")
	}
}
