package proto

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/jsonlite"
)

// The keeper's messages (decision 1701). The keeper is the node's child
// subreaper and the custodian of every container's stdio; the monitor is
// its child and runs the logic. They talk over a SOCK_SEQPACKET socketpair:
// one message per packet, a JSON object in this package's codec, the
// container's stdio fds riding along as SCM_RIGHTS on a register or an
// adopt. Both ends are the same berth-shim binary, but a monitor restarted
// after an upgrade may be newer than its keeper: unknown keys are skipped.

// Keeper message ops.
const (
	// KeeperRegister (monitor → keeper): a container's init, its pod dir,
	// its create request and its stdio fds (Streams names them). A
	// second register of one ID replaces the first (a restored
	// container's start).
	KeeperRegister = "register"
	// KeeperStarted (monitor → keeper): the container was started.
	KeeperStarted = "started"
	// KeeperCloseStdin (monitor → keeper): the monitor closed the
	// container's stdin; the keeper closes its copy so the container sees
	// EOF.
	KeeperCloseStdin = "close-stdin"
	// KeeperForget (monitor → keeper): the container is deleted.
	KeeperForget = "forget"
	// KeeperExit (keeper → monitor): a child of the keeper (pid) was
	// reaped with Status.
	KeeperExit = "exit"
	// KeeperAdopt (keeper → a new monitor): one container the keeper
	// holds, as registered, its exit if reaped, its fds.
	KeeperAdopt = "adopt"
	// KeeperAdopted (keeper → a new monitor): the adopt list is over.
	KeeperAdopted = "adopted"
	// KeeperPing (keeper → monitor): are you there? Sent only after the
	// adopt list, one at a time (decision 3300).
	KeeperPing = "ping"
	// KeeperPong (monitor → keeper): the answer to a ping, sent once the
	// monitor could take its own locks; and once unasked, when the
	// monitor starts serving (after adoption).
	KeeperPong = "pong"
	// KeeperLazyHold (monitor → keeper, and keeper → lazy-layer server):
	// a lazy layer's FUSE connection (one /dev/fuse fd), ID its chain ID,
	// Dir its layer dir, which says all a server needs (decision 3600,
	// S4). The keeper holds the fd until the layer is dropped and hands
	// it to every server it starts. Keeper → a new monitor, in the adopt
	// list: a layer held, with no fd.
	KeeperLazyHold = "lazy-hold"
	// KeeperLazyDrop (monitor → keeper, and keeper → server): the lazy
	// layer ID is gone; the keeper closes its fd. Keeper → monitor: the
	// keeper gave the layer up (its server's crash loop).
	KeeperLazyDrop = "lazy-drop"
)

// MonitorHandedOver is the exit code of a monitor that handed its
// containers over on SIGTERM (an upgrade): its keeper starts the next one
// at once, from the binary at its path.
const MonitorHandedOver = 75

// MaxKeeperMsg bounds one keeper packet.
const MaxKeeperMsg = 64 << 10

// MaxKeeperFds bounds the fds one keeper packet carries (stdout, stderr,
// stdin; or a pty).
const MaxKeeperFds = 3

// KeeperMsg is one message between keeper and monitor.
type KeeperMsg struct {
	Op      string // "op"
	ID      string // "id": the container
	Dir     string // "dir": its pod's dir
	Pid     int    // "pid": its init (0: a restored container not started)
	Running bool   // "running": started
	// Exited and Status: the init was reaped with this wait status.
	Exited bool // "exited"
	Status int  // "status"
	// Streams names the fds that ride along, in order: "stdout", "stderr",
	// "stdin" (pipes) or "pty" (a terminal's master), comma-separated.
	Streams string // "streams"
	// Create is the container's create request (AppendRequest's JSON),
	// which the keeper holds for a new monitor without reading it.
	Create string // "create"
}

// StreamNames splits Streams.
func (m *KeeperMsg) StreamNames() []string {
	if m.Streams == "" {
		return nil
	}
	return strings.Split(m.Streams, ",")
}

// AppendKeeperMsg appends m's JSON to b.
func AppendKeeperMsg(b []byte, m *KeeperMsg) []byte {
	o := jsonlite.BeginObject(b)
	o.Str("op", m.Op)
	o.StrOmit("id", m.ID)
	o.StrOmit("dir", m.Dir)
	o.IntOmit("pid", int64(m.Pid))
	o.BoolOmit("running", m.Running)
	o.BoolOmit("exited", m.Exited)
	if m.Exited {
		o.Int("status", int64(m.Status))
	}
	o.StrOmit("streams", m.Streams)
	o.StrOmit("create", m.Create)
	return o.End()
}

// DecodeKeeperMsg parses one keeper message.
func DecodeKeeperMsg(body []byte) (*KeeperMsg, error) {
	m := &KeeperMsg{}
	err := jsonlite.Document(body, func(d *jsonlite.Decoder) error {
		return d.Object(func(key string) (err error) {
			switch key {
			case "op":
				m.Op, err = d.Str()
			case "id":
				m.ID, err = d.Str()
			case "dir":
				m.Dir, err = d.Str()
			case "pid":
				m.Pid, err = d.Int()
			case "running":
				m.Running, err = d.Bool()
			case "exited":
				m.Exited, err = d.Bool()
			case "status":
				m.Status, err = d.Int()
			case "streams":
				m.Streams, err = d.Str()
			case "create":
				m.Create, err = d.Str()
			default:
				err = d.Skip()
			}
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("decode keeper message: %w", err)
	}
	if m.Op == "" {
		return nil, fmt.Errorf("decode keeper message: no op")
	}
	return m, nil
}

// SendKeeperMsg sends m with fds on the blocking SOCK_SEQPACKET socket fd.
func SendKeeperMsg(fd int, m *KeeperMsg, fds []int) error {
	b := AppendKeeperMsg(make([]byte, 0, 256), m)
	if len(b) > MaxKeeperMsg {
		return fmt.Errorf("keeper message of %d bytes exceeds %d", len(b), MaxKeeperMsg)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for {
		err := unix.Sendmsg(fd, b, oob, nil, unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		return nil
	}
}

// TrySendKeeperMsg is SendKeeperMsg (without fds) that never blocks:
// unix.EAGAIN when the peer's buffer is full (it does not read).
func TrySendKeeperMsg(fd int, m *KeeperMsg) error {
	b := AppendKeeperMsg(make([]byte, 0, 64), m)
	for {
		err := unix.Sendmsg(fd, b, nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		return nil
	}
}

// KeeperReader reads keeper messages from one link. Its buffers are
// reused: keeper and monitor read a message per container event for as
// long as they run, and a fresh 64 KiB per message would pile up garbage
// they collect rarely (decision 1701).
type KeeperReader struct {
	fd  int
	buf []byte
	oob []byte
}

// NewKeeperReader reads from the blocking SOCK_SEQPACKET socket fd.
func NewKeeperReader(fd int) *KeeperReader {
	return &KeeperReader{fd: fd, buf: make([]byte, MaxKeeperMsg), oob: make([]byte, unix.CmsgSpace(MaxKeeperFds*4))}
}

// Recv reads one message and the fds it carries (the caller owns them);
// io.EOF when the peer is gone.
func (r *KeeperReader) Recv() (*KeeperMsg, []int, error) {
	buf, oob := r.buf, r.oob
	var n, oobn, flags int
	var err error
	for {
		n, oobn, flags, _, err = unix.Recvmsg(r.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, nil, os.NewSyscallError("recvmsg", err)
	}
	var fds []int
	if oobn > 0 {
		cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, nil, fmt.Errorf("keeper message: %w", err)
		}
		for i := range cmsgs {
			got, err := unix.ParseUnixRights(&cmsgs[i])
			if err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if n == 0 && oobn == 0 {
		return nil, nil, io.EOF
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		CloseFds(fds)
		return nil, nil, fmt.Errorf("keeper message truncated")
	}
	m, err := DecodeKeeperMsg(buf[:n])
	if err != nil {
		CloseFds(fds)
		return nil, nil, err
	}
	return m, fds, nil
}

// CloseFds closes the descriptors of a keeper message; negative ones
// (the keeper's mark for a stream already closed) are skipped.
func CloseFds(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}
