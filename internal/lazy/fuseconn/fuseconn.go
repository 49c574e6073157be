// Package fuseconn keeps a FUSE mount's kernel connection usable across the
// death of the process that serves it (decision 3600, S4).
//
// A privileged parent mounts (Mount): it opens /dev/fuse, mounts it, and
// answers the kernel's INIT itself, so that it holds the connection (a
// *os.File) and the handshake (Settings: the kernel's INIT request and the
// reply, a small file beside the mount) and no server state. A server,
// in any process and as many times as it is restarted, serves a go-fuse
// fs tree on that connection (Serve) without the INIT the kernel sends
// only once: go-fuse's NewServer always reads one, so Serve gives it the
// saved one through a socket pair, checks that it answers exactly as the
// mount did, and then puts the real /dev/fuse in the socket's place (one
// dup3). It asks the kernel (FUSE_NOTIFY_RESEND, Linux 6.9) to send again
// the requests a dead server had read and not answered, so a reader
// blocked in one is answered by the new server.
//
// The tree must be static and built when the root is added (persistent
// inodes, each with a stable, unique StableAttr.Ino, as internal/lazy
// builds a layer from its TOC): Serve uses the inode number as the FUSE
// node ID (fs.Options.ExternalNodeID), registers every node before it
// reads a request, and never forgets one (fuse.MountOptions.RememberInodes),
// so the node IDs the kernel got from a dead server mean the same nodes
// to the new one. A handle is a number in the dead server's memory: a
// directory's is opened again, a file's is taken as none (handles), so
// the tree's nodes must serve reads by node (fs.NodeReader), whatever
// their Open returned.
//
// A server must not open files of the filesystem it serves through the os
// package: Go registers an opened file with its epoll, the kernel then asks
// the server (FUSE_POLL) while that thread holds its P, and the process
// can deadlock. go-fuse avoids it with a poll at mount time
// (fuse/poll.go), which it skips for a connection it did not mount.
package fuseconn

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/berthcri/berth/internal/atomicfile"
)

// FUSE wire constants (include/uapi/linux/fuse.h).
const (
	inHeaderSize  = 40 // struct fuse_in_header
	outHeaderSize = 16 // struct fuse_out_header
	opInit        = 26 // FUSE_INIT
	// notifyResend is FUSE_NOTIFY_RESEND (protocol 7.40, Linux 6.9).
	notifyResend = 7
	// hasResend is FUSE_HAS_RESEND, the kernel's INIT flag that says it
	// takes notifyResend (bit 39: flags2 bit 7).
	hasResend = 1 << 39
	// minReadBuffer is FUSE_MIN_READ_BUFFER: a smaller read of /dev/fuse
	// fails with EINVAL.
	minReadBuffer = 8192
)

// maxSettingsFile bounds what Load reads: an INIT request and its reply
// are a few hundred bytes in base64.
const maxSettingsFile = 16 << 10

// Settings is the handshake of one mount: what a server needs, besides
// the /dev/fuse fd, to serve it.
type Settings struct {
	// Init is the kernel's INIT request as read from /dev/fuse
	// (fuse_in_header and fuse_init_in).
	Init []byte `json:"init"`
	// Reply is the answer the mount gave (fuse_out_header and
	// fuse_init_out). Every server must give the same: the kernel
	// decided the connection's parameters (request sizes, flags) on it.
	Reply []byte `json:"reply"`
	// Conn identifies the connection (16 random bytes in hex, made by
	// Mount): the records of its backing files (Serve's backing) are
	// this connection's only if they carry it. Empty in settings saved
	// before it existed: then no open is passed through.
	Conn string `json:"conn,omitempty"`
}

// check reports what makes s unusable: a request that is not an INIT or
// whose header does not match its length, a reply that does not answer it.
func (s *Settings) check() error {
	le := binary.LittleEndian
	switch {
	case len(s.Init) < inHeaderSize+8:
		return fmt.Errorf("INIT request of %d bytes is too short", len(s.Init))
	case le.Uint32(s.Init[0:]) != uint32(len(s.Init)):
		return fmt.Errorf("INIT request says %d bytes, has %d", le.Uint32(s.Init[0:]), len(s.Init))
	case le.Uint32(s.Init[4:]) != opInit:
		return fmt.Errorf("request has opcode %d, not INIT", le.Uint32(s.Init[4:]))
	case len(s.Reply) < outHeaderSize+8:
		return fmt.Errorf("INIT reply of %d bytes is too short", len(s.Reply))
	case le.Uint32(s.Reply[0:]) != uint32(len(s.Reply)):
		return fmt.Errorf("INIT reply says %d bytes, has %d", le.Uint32(s.Reply[0:]), len(s.Reply))
	case int32(le.Uint32(s.Reply[4:])) != 0:
		return fmt.Errorf("INIT reply is an error (%d)", int32(le.Uint32(s.Reply[4:])))
	case le.Uint64(s.Reply[8:]) != le.Uint64(s.Init[8:]):
		return errors.New("INIT reply answers another request")
	}
	return nil
}

// flags are the kernel's INIT flags (flags, and flags2 where the kernel
// sent fuse_init_in's 7.36 form).
func (s *Settings) flags() uint64 {
	in := s.Init[inHeaderSize:]
	if len(in) < 16 {
		return 0
	}
	f := uint64(binary.LittleEndian.Uint32(in[12:]))
	if len(in) >= 20 {
		f |= uint64(binary.LittleEndian.Uint32(in[16:])) << 32
	}
	return f
}

// CanResend reports whether the kernel of this mount takes
// FUSE_NOTIFY_RESEND, so that a restarted server answers the requests
// its predecessor read and left.
func (s *Settings) CanResend() bool { return s.flags()&hasResend != 0 }

// Save writes s to path (0600), atomically.
func (s *Settings) Save(path string) error {
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("save FUSE settings %s: %w", path, err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("save FUSE settings %s: %w", path, err)
	}
	return nil
}

// Load reads the settings Save wrote at path and checks that they are a
// handshake a server can resume.
func Load(path string) (*Settings, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load FUSE settings: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSettingsFile+1))
	if err != nil {
		return nil, fmt.Errorf("load FUSE settings %s: %w", path, err)
	}
	if len(data) > maxSettingsFile {
		return nil, fmt.Errorf("load FUSE settings %s: larger than %d bytes", path, maxSettingsFile)
	}
	var s Settings
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("load FUSE settings %s: %w", path, err)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("load FUSE settings %s: %w", path, err)
	}
	return &s, nil
}
