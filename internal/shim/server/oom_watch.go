package server

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
type oomWatch struct {
	seen atomic.Bool
	f    *os.File // eventfd or inotify fd, non-blocking: Close ends the read
}

// watchOOM starts watching the memory cgroup dir; nil when it cannot (the
// counter at exit is then all there is).
func watchOOM(dir string) *oomWatch {
	// Only a systemd scope vanishes with its last process; a cgroupfs
	// cgroup stays until the runtime deletes it, so the counter read at
	// exit suffices there and the shim keeps no goroutine, fd and buffer
	// per container for it (decision 0303).
	if dir == "" || !strings.HasSuffix(dir, ".scope") {
		return nil
	}
	w := &oomWatch{}
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
		if oomKills(dir) > 0 {
			w.seen.Store(true)
		}
	}
}

// killed reports whether an OOM kill was seen.
func (w *oomWatch) killed() bool { return w != nil && w.seen.Load() }

// stop ends the watch.
func (w *oomWatch) stop() {
	if w != nil {
		w.f.Close()
	}
}
