package shim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// lockedNodeDir returns a new shims dir and its node dir, with the launch
// lock taken as Launch takes it.
func lockedNodeDir(t *testing.T) (shims, nodeDir string, lock *os.File) {
	t.Helper()
	shims = filepath.Join(t.TempDir(), "shims")
	nodeDir = proto.NodeDir(shims)
	lock, err := lockNode(nodeDir, true)
	if err != nil {
		t.Fatal(err)
	}
	return shims, nodeDir, lock
}

// berthd dying between starting the node's keeper and the monitor
// listening leaves a keeper and monitor that serve no pod. The restarted
// berthd's StopIdleNode must stop them, not miss them for want of a
// monitor answering yet: the launch lock, handed to the keeper and on to
// the monitor, makes it wait until the monitor listens.
func TestStopIdleNodeWaitsForAMonitorLaunchedByADeadBerthd(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t) // as berth-shim does
	shims, nodeDir, lock := lockedNodeDir(t)
	cmd, ready, err := startKeeper(bundletest.ShimBinary(t), nodeDir, lock)
	if err != nil {
		t.Fatal(err)
	}
	go cmd.Wait() //nolint:errcheck // reaped, as berthd reaps its child
	// berthd "dies": its lock and readiness pipe go, at once.
	lock.Close()
	ready.Close()
	if err := StopIdleNode(context.Background(), shims); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(berthdtest.PidsMentioning(nodeDir+"\x00")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("keeper and monitor still running after StopIdleNode: %v", berthdtest.PidsMentioning(nodeDir+"\x00"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(nodeDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node dir after the node stopped: %v", err)
	}
}

// Once the monitor listens, nothing holds the launch lock: the next launch
// takes it at once.
func TestLaunchLockIsFreeOnceTheMonitorListens(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t) // as berth-shim does
	shims, nodeDir, lock := lockedNodeDir(t)
	if err := launchNode(bundletest.ShimBinary(t), nodeDir, lock); err != nil {
		t.Fatal(err)
	}
	lock.Close()
	t.Cleanup(func() { _ = StopIdleNode(context.Background(), shims) })
	f, err := os.Open(proto.LaunchLockPath(nodeDir))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("launch lock still held with the monitor listening: %v", err)
	}
}

// berthd dying after taking the launch lock but before starting the keeper
// leaves the node dir with only its lock (or, earlier, empty):
// StopIdleNode removes it, and leaves a dir whose (crashed) monitor's
// socket is still there while its keeper lives, but not once it died.
func TestStopIdleNodeRemovesALaunchCutShortBeforeTheKeeper(t *testing.T) {
	t.Parallel()
	shims, nodeDir, lock := lockedNodeDir(t)
	lock.Close() // berthd "dies" before startKeeper
	if err := StopIdleNode(context.Background(), shims); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(nodeDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node dir after StopIdleNode: %v", err)
	}

	// Cut short before the lock was made: an empty dir.
	if err := os.MkdirAll(nodeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := StopIdleNode(context.Background(), shims); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(nodeDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty node dir after StopIdleNode: %v", err)
	}

	// A monitor that crashed left its socket; its keeper, living (its
	// lock held), restarts it there.
	lock, err := lockNode(nodeDir, true)
	if err != nil {
		t.Fatal(err)
	}
	lock.Close()
	if err := os.WriteFile(proto.NodeSocketPath(nodeDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	keeperLock, err := os.OpenFile(proto.KeeperLockPath(nodeDir), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(keeperLock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := StopIdleNode(context.Background(), shims); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(proto.NodeSocketPath(nodeDir)); err != nil {
		t.Fatalf("a crashed monitor's node dir was touched while its keeper lives: %v", err)
	}

	// Keeper and monitor both died: nothing will listen there again.
	keeperLock.Close()
	if err := StopIdleNode(context.Background(), shims); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(nodeDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the node dir of a dead keeper and monitor after StopIdleNode: %v", err)
	}
}
