package monitor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// oomWatch notices an OOM kill in a container's memory cgroup while it
// happens. Reading the counter at exit is not enough under the systemd
// cgroup driver: systemd removes a scope's cgroup as soon as its last
// process is gone, often before the exit is handled. v1 registers an
// eventfd on memory.oom_control (cgroup.event_control); v2 watches
// memory.events with inotify. Each wake-up reads the cgroup while it still
// exists.
//
// On v2 a wake-up can come too late: the kernel sends memory.events
// notifications at most every 10 ms, so when one allocation takes a
// container straight from "max" to its kill, the wake-up that reads
// "oom_kill 0" comes first and the next one after systemd removed the
// scope. So the watch also keeps the parent's (the pod slice's) oom_kill,
// which v2 counts for the whole subtree and which outlives the scope,
// taken anew at every wake-up that still finds the scope with no kill of
// its own; a parent count above it once the scope is gone is this
// container's kill (parentKilled). Only a sibling killed between this
// container's last memory event and its own death could be mistaken for
// it, and only when this one also died by SIGKILL.
type oomWatch struct {
	seen atomic.Bool
	f    *os.File // eventfd or inotify fd, non-blocking: Close ends the read
	// parentBase is the parent's oom_kill at the last wake-up that found
	// the scope without a kill of its own (v2 only; -1: not kept).
	parentBase atomic.Int64
}

// watchOOM starts watching the memory cgroup dir; nil when it cannot (the
// counter at exit is then all there is).
func watchOOM(dir string) *oomWatch {
	// Only a systemd scope vanishes with its last process; a cgroupfs
	// cgroup stays until the runtime deletes it, so the counter read at
	// exit suffices there and the monitor keeps no goroutine, fd and buffer
	// per container for it (decision 0303).
	if dir == "" || !strings.HasSuffix(dir, ".scope") {
		return nil
	}
	w := &oomWatch{}
	w.parentBase.Store(-1)
	if _, err := os.Stat(filepath.Join(dir, "memory.oom_control")); err == nil {
		if w.f = eventOnOOMControl(dir); w.f == nil {
			return nil
		}
	} else {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return nil
		}
		if _, err := unix.InotifyAddWatch(fd, filepath.Join(dir, "memory.events"), unix.IN_MODIFY); err != nil {
			unix.Close(fd)
			return nil
		}
		w.f = os.NewFile(uintptr(fd), "inotify")
		if n, ok := readOOMKills(filepath.Dir(dir)); ok {
			w.parentBase.Store(int64(n))
		}
	}
	go w.run(dir)
	return w
}

func eventOnOOMControl(dir string) *os.File {
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return nil
	}
	defer ctl.Close()
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil
	}
	reg := strconv.Itoa(efd) + " " + strconv.Itoa(int(ctl.Fd()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(reg), 0o200); err != nil {
		unix.Close(efd)
		return nil
	}
	return os.NewFile(uintptr(efd), "eventfd")
}

func (w *oomWatch) run(dir string) {
	buf := make([]byte, 64) // one eventfd count or inotify event (no name)
	for {
		if _, err := w.f.Read(buf); err != nil {
			return
		}
		// v1 signals before the kill is counted, and also when the cgroup
		// goes away: a wake-up while the cgroup is still readable is the
		// OOM. v2 counts first, then notifies.
		if _, err := os.Stat(filepath.Join(dir, "memory.oom_control")); err == nil {
			if _, err := os.ReadFile(filepath.Join(dir, "memory.oom_control")); err == nil {
				w.seen.Store(true)
			}
			continue
		}
		parent, parentOK := readOOMKills(filepath.Dir(dir))
		n, ok := readOOMKills(dir)
		switch {
		case ok && n > 0:
			w.seen.Store(true)
		case ok && parentOK && w.parentBase.Load() >= 0:
			w.parentBase.Store(int64(parent))
		}
	}
}

// parentKilled reports, once the container's scope is gone, whether the
// parent counted an OOM kill since the watch last saw the scope without
// one (v2; see oomWatch).
func (w *oomWatch) parentKilled(dir string) bool {
	if w == nil || w.parentBase.Load() < 0 {
		return false
	}
	if _, err := os.Stat(dir); err == nil {
		return false // the scope is there: its own count is the answer
	}
	n, ok := readOOMKills(filepath.Dir(dir))
	return ok && int64(n) > w.parentBase.Load()
}

// killed reports whether an OOM kill was seen.
func (w *oomWatch) killed() bool { return w != nil && w.seen.Load() }

// stop ends the watch.
func (w *oomWatch) stop() {
	if w != nil {
		w.f.Close()
	}
}
