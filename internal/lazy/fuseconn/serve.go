package fuseconn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Server is a go-fuse server on a connection that Mount made.
type Server struct {
	srv  *fuse.Server
	done chan struct{}
}

// Serve serves root on the connection dev with the handshake s: the
// first server of a mount and every one after it alike. opts must be
// those the mount was made with (Serve refuses a server that would
// answer INIT otherwise: the kernel sized its requests on the mount's
// answer); Serve adds ExternalNodeID and RememberInodes (see the package
// comment). On return the server holds its own reference to the
// connection: the caller may close dev.
//
// If the kernel takes it, Serve asks for the requests a previous server
// read and did not answer (FUSE_NOTIFY_RESEND); they come again with the
// high bit of their unique ID set, which go-fuse echoes in its replies.
//
// backing is the path of the connection's records of backing files
// (backing.go), the same for every server of it: an open that the tree
// answers with FOPEN_PASSTHROUGH, of a node that is a BackingFiler, is
// passed through to the node's file, registered once for the connection's
// life. "" answers every open in cached mode. The tree's files must not
// implement fs.FilePassthroughFder: go-fuse would register backing files
// of its own, and close them.
func Serve(dev *os.File, s *Settings, root fs.InodeEmbedder, opts *fs.Options, backing string) (*Server, error) {
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("serve FUSE: %w", err)
	}
	o := *opts
	o.ExternalNodeID = true
	o.MountOptions.RememberInodes = true
	// A server refused below is retired by a failed read, which go-fuse
	// logs: that line would only mislead.
	logs := newMutableLogger(o.MountOptions.Logger)
	o.MountOptions.Logger = logs.Logger
	raw := fs.NewNodeFS(root, &o)

	h := newHandles(raw)
	srv, fdNum, reply, err := handshake(h, &o.MountOptions, s.Init)
	if err != nil {
		return nil, fmt.Errorf("serve FUSE: %w", err)
	}
	fail := func(err error) (*Server, error) {
		logs.mute.Store(true)
		if h.backing != nil {
			h.backing.close()
		}
		return nil, errors.Join(fmt.Errorf("serve FUSE: %w", err), retire(srv, fdNum))
	}
	if !bytes.Equal(reply, s.Reply) {
		return fail(errors.New("this server answers INIT otherwise than the mount did (its options differ)"))
	}
	files := map[uint64]*fs.Inode{}
	if err := register(raw, root.EmbeddedInode(), fuse.FUSE_ROOT_ID, files); err != nil {
		return fail(err)
	}
	if backing != "" {
		if h.backing, err = openBacking(backing, s.Conn, files, srv, logs.Logger); err != nil {
			return fail(err)
		}
	}
	// From here on go-fuse's fd is the connection.
	if err := unix.Dup3(int(dev.Fd()), fdNum, unix.O_CLOEXEC); err != nil {
		return fail(fmt.Errorf("take over the connection: %w", err))
	}
	if s.CanResend() {
		if err := resend(fdNum); err != nil {
			return fail(err)
		}
	}
	out := &Server{srv: srv, done: make(chan struct{})}
	go func() {
		defer close(out.done)
		srv.Serve()
		if h.backing != nil {
			h.backing.close()
		}
	}()
	return out, nil
}

// Wait returns when the connection ended (the filesystem was unmounted
// and nothing uses it any more).
func (s *Server) Wait() { <-s.done }

// handshake makes a go-fuse server of raw under o, on one end of a socket
// pair whose other end has given it init and taken its reply. The server
// has not read anything else; its fd is fdNum, which the caller replaces
// (Serve with the connection, retire with a dead end).
func handshake(raw fuse.RawFileSystem, o *fuse.MountOptions, init []byte) (srv *fuse.Server, fdNum int, reply []byte, err error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("INIT handshake: %w", err)
	}
	ours, theirs := pair[0], pair[1]
	defer unix.Close(ours)
	if _, err := unix.Write(ours, init); err != nil {
		unix.Close(theirs)
		return nil, 0, nil, fmt.Errorf("INIT handshake: %w", err)
	}
	mo := *o
	// go-fuse's magic mountpoint: serve an fd someone else mounted.
	mo.DirectMount, mo.DirectMountStrict = false, false
	srv, err = fuse.NewServer(raw, fmt.Sprintf("/dev/fd/%d", theirs), &mo)
	if err != nil {
		// go-fuse closed theirs with its server.
		return nil, 0, nil, fmt.Errorf("INIT handshake: %w", err)
	}
	buf := make([]byte, 4096)
	n, err := readRetry(ours, buf)
	if err != nil {
		return nil, 0, nil, errors.Join(fmt.Errorf("INIT handshake: read the reply: %w", err), retire(srv, theirs))
	}
	return srv, theirs, buf[:n:n], nil
}

// retire ends a server that has not started serving, or serves the
// connection: its fd becomes one that cannot be read, so its first read
// fails and Serve returns (after closing that fd). The connection, if it
// was there, is untouched: other holders keep it.
func retire(srv *fuse.Server, fdNum int) error {
	null, err := unix.Open("/dev/null", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("retire FUSE server: %w", err)
	}
	defer unix.Close(null)
	if err := unix.Dup3(null, fdNum, unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("retire FUSE server: %w", err)
	}
	srv.Serve()
	return nil
}

// register looks up every node below dir (node ID id) through raw, so
// that raw knows each by the node ID the kernel may hold for it from a
// previous server, and puts the regular files in files.
func register(raw fuse.RawFileSystem, dir *fs.Inode, id uint64, files map[uint64]*fs.Inode) error {
	for name, child := range dir.Children() {
		var out fuse.EntryOut
		if st := raw.Lookup(nil, &fuse.InHeader{NodeId: id}, name, &out); !st.Ok() {
			return fmt.Errorf("register node %q: %v", name, st)
		}
		if out.NodeId != child.StableAttr().Ino {
			return fmt.Errorf("register node %q: node ID %d is not its inode number %d", name, out.NodeId, child.StableAttr().Ino)
		}
		switch child.StableAttr().Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := register(raw, child, out.NodeId, files); err != nil {
				return err
			}
		case unix.S_IFREG:
			files[out.NodeId] = child
		}
	}
	return nil
}

// resend asks the kernel to queue again the requests that servers on this
// connection read and did not answer.
func resend(fd int) error {
	var msg [outHeaderSize]byte
	binary.LittleEndian.PutUint32(msg[0:], outHeaderSize)
	binary.LittleEndian.PutUint32(msg[4:], notifyResend) // unique 0: a notification
	if _, err := unix.Write(fd, msg[:]); err != nil {
		return fmt.Errorf("FUSE_NOTIFY_RESEND: %w", err)
	}
	return nil
}

// mutableLogger is a go-fuse logger that can be silenced.
type mutableLogger struct {
	*log.Logger
	w    io.Writer
	mute atomic.Bool
}

func newMutableLogger(l *log.Logger) *mutableLogger {
	if l == nil {
		l = log.Default() // go-fuse's default
	}
	m := &mutableLogger{w: l.Writer()}
	m.Logger = log.New(m, l.Prefix(), l.Flags())
	return m
}

func (m *mutableLogger) Write(p []byte) (int, error) {
	if m.mute.Load() {
		return len(p), nil
	}
	return m.w.Write(p)
}
