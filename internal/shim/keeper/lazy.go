package keeper

import (
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// Lazy layers (decision 3600, S4): the keeper holds each lazy layer's
// FUSE connection (a /dev/fuse fd, from a lazy-hold message) for as long
// as the layer exists, and runs the lazy-layer server (berth-lazy, beside
// berth-shim) as its child, handing it every held connection on a link of
// its own, as it hands the monitor its containers. A connection whose
// last fd closes is aborted by the kernel, so the keeper never closes one
// while the layer lives, whatever the server does. It reads nothing of
// the layers: a chain ID, a dir and an fd.

// LazyBinary is the lazy-layer server's file name, beside berth-shim.
const LazyBinary = proto.LazyServerBinary

// The server's restart: back-off as for the monitor; lazyCrashLoop
// deaths in a row, none after lazyStableLife of life, are a crash loop.
const (
	lazyStableLife = 10 * time.Second
	lazyCrashLoop  = 5
)

// lazyHold is one held connection.
type lazyHold struct {
	dir string
	fd  int
}

// lazyState is the keeper's part for lazy layers; guarded by Keeper.mu.
type lazyState struct {
	holds   map[string]*lazyHold // by chain ID
	pid     int                  // the server, 0 when none runs
	link    int                  // its link, -1 when none
	started time.Time
	deaths  int // in a row, each before lazyStableLife
	delay   time.Duration
	pending bool // a restart is scheduled
}

// lazyMsgLocked applies a lazy-hold or lazy-drop; it owns fds.
func (k *Keeper) lazyMsgLocked(m *proto.KeeperMsg, fds []int) {
	z := &k.lazy
	switch m.Op {
	case proto.KeeperLazyHold:
		if len(fds) != 1 || m.ID == "" || m.Dir == "" {
			k.logf("lazy-hold of %q: %d fds; refused", m.ID, len(fds))
			proto.CloseFds(fds)
			return
		}
		if z.holds == nil {
			z.holds = map[string]*lazyHold{}
		}
		if old := z.holds[m.ID]; old != nil {
			unix.Close(old.fd)
		}
		z.holds[m.ID] = &lazyHold{dir: m.Dir, fd: fds[0]}
		if z.link >= 0 {
			k.sendLazyLocked(&proto.KeeperMsg{Op: proto.KeeperLazyHold, ID: m.ID, Dir: m.Dir}, fds[0])
		} else if z.pid == 0 && !z.pending {
			k.startLazyLocked()
		}
	case proto.KeeperLazyDrop:
		proto.CloseFds(fds)
		if h := z.holds[m.ID]; h != nil {
			unix.Close(h.fd)
			delete(z.holds, m.ID)
		}
		if z.link >= 0 {
			k.sendLazyLocked(&proto.KeeperMsg{Op: proto.KeeperLazyDrop, ID: m.ID}, -1)
		}
	}
}

func (k *Keeper) sendLazyLocked(m *proto.KeeperMsg, fd int) {
	var fds []int
	if fd >= 0 {
		fds = []int{fd}
	}
	if err := proto.SendKeeperMsg(k.lazy.link, m, fds); err != nil {
		k.logf("tell the lazy-layer server %s %s: %v", m.Op, m.ID, err)
	}
}

// startLazyLocked starts the server with a fresh link and hands it every
// held connection. Under k.mu, so that Run, which compares a reaped pid
// with lazy.pid under k.mu, never takes it for another child.
func (k *Keeper) startLazyLocked() {
	z := &k.lazy
	z.pending = false
	if len(z.holds) == 0 {
		return
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		k.logf("start the lazy-layer server: %v", err)
		k.lazyDiedLocked()
		return
	}
	mine, theirs := sp[0], sp[1]
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		unix.Close(mine)
		unix.Close(theirs)
		k.logf("start the lazy-layer server: %v", err)
		k.lazyDiedLocked()
		return
	}
	defer null.Close()
	binary := filepath.Join(filepath.Dir(k.binary), LazyBinary)
	argv := []string{binary, "--log", filepath.Join(k.dir, "lazy.log")}
	files := []uintptr{null.Fd(), null.Fd(), null.Fd(), uintptr(theirs)}
	pid, err := syscall.ForkExec(binary, argv, &syscall.ProcAttr{Dir: "/", Env: os.Environ(), Files: files})
	unix.Close(theirs)
	if err != nil {
		unix.Close(mine)
		k.logf("start the lazy-layer server: %v", err)
		k.lazyDiedLocked()
		return
	}
	z.pid, z.link, z.started = pid, mine, time.Now()
	for id, h := range z.holds {
		k.sendLazyLocked(&proto.KeeperMsg{Op: proto.KeeperLazyHold, ID: id, Dir: h.dir}, h.fd)
	}
	k.sendLazyLocked(&proto.KeeperMsg{Op: proto.KeeperAdopted}, -1)
	k.logf("lazy-layer server %d started with %d layers", pid, len(z.holds))
}

// lazyReapedLocked: the server died (pid was lazy.pid).
func (k *Keeper) lazyReapedLocked(ws unix.WaitStatus) {
	z := &k.lazy
	k.logf("lazy-layer server %d ended (%s) holding %d layers", z.pid, describe(ws), len(z.holds))
	unix.Close(z.link)
	z.pid, z.link = 0, -1
	if time.Since(z.started) >= lazyStableLife {
		z.deaths, z.delay = 0, 0
	}
	k.lazyDiedLocked()
}

// lazyDiedLocked schedules the server's restart, or, after a crash loop,
// gives the layers up: their connections are aborted (the keeper's fds
// were the last), so readers get ENOTCONN instead of waiting for ever,
// and berthd drops the layers.
func (k *Keeper) lazyDiedLocked() {
	z := &k.lazy
	z.deaths++
	if z.deaths >= lazyCrashLoop {
		k.logf("lazy-layer server: %d deaths in a row; aborting the connections of %d layers", z.deaths, len(z.holds))
		for id, h := range z.holds {
			unix.Close(h.fd)
			delete(z.holds, id)
			// The monitor forgets it too: it lists it no more, and no
			// longer stays for it.
			if k.link >= 0 {
				if err := proto.SendKeeperMsg(k.link, &proto.KeeperMsg{Op: proto.KeeperLazyDrop, ID: id}, nil); err != nil {
					k.logf("tell the monitor lazy layer %s was given up: %v", id, err)
				}
			}
		}
		z.deaths, z.delay = 0, 0
		return
	}
	if len(z.holds) == 0 {
		return
	}
	z.delay = min(max(2*z.delay, minRestartDelay), maxRestartDelay)
	z.pending = true
	time.AfterFunc(z.delay, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if z.pid == 0 {
			k.startLazyLocked()
		}
	})
}
