package daemon

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holdLock takes the root's lock through a file of its own, as another
// process (or a dying berthd's child) would.
func holdLock(t *testing.T, root string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(root, "berthd.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("4242\n"); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLockRootWritesOurPid(t *testing.T) {
	root := t.TempDir()
	f, err := lockRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, _ := os.ReadFile(filepath.Join(root, "berthd.lock"))
	if strings.TrimSpace(string(data)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q", data)
	}
}

// A lock released shortly (the children of a berthd killed mid-fork
// exec and drop it) is waited for.
func TestLockRootWaitsForAShortHolder(t *testing.T) {
	root := t.TempDir()
	held := holdLock(t, root)
	time.AfterFunc(300*time.Millisecond, func() { held.Close() })
	f, err := lockRoot(root)
	if err != nil {
		t.Fatalf("lock released after 300ms not taken: %v", err)
	}
	f.Close()
}

func TestLockRootRefusesALiveHolder(t *testing.T) {
	root := t.TempDir()
	held := holdLock(t, root)
	defer held.Close()
	start := time.Now()
	_, err := lockRoot(root)
	if err == nil || !strings.Contains(err.Error(), "another berthd (pid 4242) is already using root") {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d < lockWait || d > lockWait+2*time.Second {
		t.Fatalf("gave up after %s, want about %s", d, lockWait)
	}
}
