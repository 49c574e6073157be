package monitor

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Lazy layers (decision 3600, S4): berthd hands the node a lazy layer's
// FUSE connection on node.sock (lazy-hold, the /dev/fuse fd riding along
// as SCM_RIGHTS) and the monitor hands it on to the keeper, which holds
// it and runs the server. The monitor keeps only the names (chain ID and
// dir): to list them to berthd, and to stay while the node holds one (an
// idle monitor that exited would be restarted by its keeper, which holds
// the layer, every 30 s). A new monitor learns them from the keeper's
// adopt list; the keeper tells it when it gave a layer up.

// fuseDev is /dev/fuse's device number (misc major 10, FUSE_MINOR 229).
var fuseDev = unix.Mkdev(10, 229)

// fdReader reads a node connection like a plain read, keeping the
// descriptors that ride along (SCM_RIGHTS) for the request they came
// with, at most maxRecvFds: more, or ones the kernel had to drop
// (MSG_CTRUNC), mark the request as carrying too many (extra), and those
// beyond the bound are closed at once, so that a peer cannot leave
// descriptors open in the monitor.
type fdReader struct {
	conn  *os.File
	oob   []byte
	fds   []int
	extra bool
}

func newFdReader(conn *os.File) *fdReader {
	return &fdReader{conn: conn, oob: make([]byte, unix.CmsgSpace(maxRecvFds*4))}
}

func (r *fdReader) Read(p []byte) (int, error) {
	rc, err := r.conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n, oobn, flags int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), p, r.oob, unix.MSG_CMSG_CLOEXEC)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err != nil {
		return 0, err
	}
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(r.oob[:oobn])
		for i := range msgs {
			if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				r.fds = append(r.fds, got...)
			}
		}
		if perr != nil || flags&unix.MSG_CTRUNC != 0 {
			r.extra = true
		}
		if len(r.fds) > maxRecvFds {
			proto.CloseFds(r.fds[maxRecvFds:])
			r.fds, r.extra = r.fds[:maxRecvFds], true
		}
	}
	if rerr != nil {
		return 0, os.NewSyscallError("recvmsg", rerr)
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// take returns the descriptors received since the last take (the
// caller owns them) and whether more came than it holds.
func (r *fdReader) take() (fds []int, extra bool) {
	fds, extra = r.fds, r.extra
	r.fds, r.extra = nil, false
	return fds, extra
}

// close closes what was received and not taken.
func (r *fdReader) close() {
	fds, _ := r.take()
	proto.CloseFds(fds)
}

// oneFuseFd checks that a lazy-hold carries exactly one descriptor and
// that it is /dev/fuse's; on error it has closed them all.
func oneFuseFd(fds []int, extra bool) (int, error) {
	if len(fds) != 1 || extra {
		proto.CloseFds(fds)
		if len(fds) == 0 && !extra {
			return -1, fmt.Errorf("the request carries no fd (want the layer's /dev/fuse connection as SCM_RIGHTS): %w", errdefs.ErrInvalidArgument)
		}
		return -1, fmt.Errorf("the request carries %d fds or more, want one: %w", max(len(fds), 2), errdefs.ErrInvalidArgument)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds[0], &st); err != nil {
		unix.Close(fds[0])
		return -1, fmt.Errorf("stat the fd: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != fuseDev {
		unix.Close(fds[0])
		return -1, fmt.Errorf("the fd is not a /dev/fuse connection (mode %o, device %d:%d): %w",
			st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), errdefs.ErrInvalidArgument)
	}
	return fds[0], nil
}

// lazyHold hands the keeper the connection in fds (owned) of layer id,
// served from dir, and names it held.
func (m *Monitor) lazyHold(id, dir string, fds []int, extra bool) error {
	err := proto.CheckChainID(id)
	if err == nil {
		err = proto.CheckLayerDir(dir)
	}
	if err != nil {
		proto.CloseFds(fds)
		return fmt.Errorf("lazy-hold: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	fd, err := oneFuseFd(fds, extra)
	if err != nil {
		return fmt.Errorf("lazy-hold of %s: %w", id, err)
	}
	defer unix.Close(fd) // the keeper has its own once sent
	// Named before it is sent, so that an idle exit cannot slip between
	// the keeper holding it and the monitor knowing it.
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return fmt.Errorf("lazy-hold of %s: monitor is exiting: %w", id, errdefs.ErrUnavailable)
	}
	old, had := m.lazy[id]
	if !had && len(m.lazy) >= proto.MaxLazyLayers {
		m.mu.Unlock()
		return fmt.Errorf("lazy-hold of %s: the node holds %d lazy layers, the most it may: %w", id, len(m.lazy), errdefs.ErrFailedPrecondition)
	}
	m.lazy[id] = dir
	m.mu.Unlock()
	if err := m.keeper.send(&proto.KeeperMsg{Op: proto.KeeperLazyHold, ID: id, Dir: dir}, []int{fd}); err != nil {
		m.mu.Lock()
		if had {
			m.lazy[id] = old
		} else {
			delete(m.lazy, id)
		}
		m.mu.Unlock()
		return fmt.Errorf("hand lazy layer %s to the keeper: %w", id, err)
	}
	m.logf("lazy layer %s held (%s)", id, dir)
	return nil
}

// lazyDrop tells the keeper that layer id is gone; the node stops once
// it holds neither pod nor layer, as when its last pod goes.
func (m *Monitor) lazyDrop(id string) error {
	if err := proto.CheckChainID(id); err != nil {
		return fmt.Errorf("lazy-drop: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	// The keeper first: once the monitor forgets the layer it may exit,
	// and the keeper must not find it still held then.
	if err := m.keeper.send(&proto.KeeperMsg{Op: proto.KeeperLazyDrop, ID: id}, nil); err != nil {
		return fmt.Errorf("tell the keeper lazy layer %s is gone: %w", id, err)
	}
	m.forgetLazy(id, "dropped")
	return nil
}

// forgetLazy forgets layer id (dropped, or given up by the keeper).
func (m *Monitor) forgetLazy(id, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, had := m.lazy[id]; !had {
		return
	}
	delete(m.lazy, id)
	m.logf("lazy layer %s %s", id, why)
	if m.idleLocked() {
		m.closeLocked("no pods nor lazy layers left")
	}
}

// adoptLazy names a layer the keeper holds (its adopt list).
func (m *Monitor) adoptLazy(msg *proto.KeeperMsg) {
	if proto.CheckChainID(msg.ID) != nil || proto.CheckLayerDir(msg.Dir) != nil {
		m.logf("the keeper named a lazy layer %q (%q) the monitor would not take; not listed", msg.ID, msg.Dir)
		return
	}
	m.mu.Lock()
	m.lazy[msg.ID] = msg.Dir
	m.mu.Unlock()
}

// lazyIDs lists the layers held.
func (m *Monitor) lazyIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.lazy))
}

// idleLocked tells whether the node holds neither pod nor lazy layer.
func (m *Monitor) idleLocked() bool { return len(m.pods) == 0 && len(m.lazy) == 0 }
