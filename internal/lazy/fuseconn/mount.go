package fuseconn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// defaultMaxWrite is go-fuse's default for MountOptions.MaxWrite, which
// the mount's max_read must match.
const defaultMaxWrite = 128 << 10

// Mount mounts a FUSE filesystem at dir (a directory that exists) and
// answers the kernel's INIT as a go-fuse server with opts would, without
// serving anything: requests wait in the kernel until a server (Serve)
// reads them. It returns the connection (the caller holds it for as long
// as the mount is to outlive its servers, and passes it to each) and the
// handshake every server needs. It needs CAP_SYS_ADMIN.
//
// The fd is opened blocking and stays so: it is one open file shared by
// every holder, and go-fuse's readers expect blocking reads (a Go
// os.OpenFile would register it with the poller and set O_NONBLOCK).
func Mount(dir string, opts *fuse.MountOptions) (dev *os.File, s *Settings, err error) {
	o := *opts
	if o.MaxWrite <= 0 {
		o.MaxWrite = defaultMaxWrite
	}
	if o.Name == "" {
		// go-fuse would name it after the RawFileSystem, which differs
		// between the mount and its servers.
		return nil, nil, fmt.Errorf("mount FUSE at %s: MountOptions.Name is required", dir)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: %w", dir, err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: open /dev/fuse: %w", dir, err)
	}
	dev = os.NewFile(uintptr(fd), "/dev/fuse")
	defer func() {
		if err != nil {
			dev.Close()
		}
	}()

	flags, data := mountData(fd, st.Mode&unix.S_IFMT, &o)
	source := o.FsName
	if source == "" {
		source = o.Name
	}
	if err := unix.Mount(source, dir, "fuse."+o.Name, flags, data); err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = Unmount(dir)
		}
	}()

	// The kernel queued INIT when it made the connection.
	buf := make([]byte, minReadBuffer+defaultMaxWrite)
	n, err := readRetry(fd, buf)
	if err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: read INIT: %w", dir, err)
	}
	s = &Settings{Init: buf[:n:n]}
	if s.Conn, err = newConnID(); err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: %w", dir, err)
	}
	if n < inHeaderSize || binary.LittleEndian.Uint32(s.Init[4:]) != opInit {
		return nil, nil, fmt.Errorf("mount FUSE at %s: the kernel's first request is not INIT", dir)
	}
	if s.Reply, err = negotiate(&o, s.Init); err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: %w", dir, err)
	}
	if err := s.check(); err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: %w", dir, err)
	}
	if _, err := unix.Write(fd, s.Reply); err != nil {
		return nil, nil, fmt.Errorf("mount FUSE at %s: answer INIT: %w", dir, err)
	}
	return dev, s, nil
}

// mountData is mount(2)'s flags and data for a FUSE mount of fd, as
// go-fuse's direct mount builds them (fuse/mount_linux.go), so that a
// filesystem mounted here is the one go-fuse would have mounted.
func mountData(fd int, rootMode uint32, o *fuse.MountOptions) (uintptr, string) {
	var flags uintptr = unix.MS_NOSUID | unix.MS_NODEV
	if o.DirectMountFlags != 0 {
		flags = o.DirectMountFlags
	}
	opts := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", rootMode),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", o.MaxWrite),
	}
	for _, opt := range o.Options {
		switch opt {
		case "nodev":
			flags |= unix.MS_NODEV
		case "dev":
			flags &^= unix.MS_NODEV
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "suid":
			flags &^= unix.MS_NOSUID
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "exec":
			flags &^= unix.MS_NOEXEC
		default:
			opts = append(opts, opt)
		}
	}
	if o.AllowOther {
		opts = append(opts, "allow_other")
	}
	return flags, strings.Join(opts, ",")
}

// negotiate is go-fuse's answer to init under o, from a server that
// serves nothing and is retired at once.
func negotiate(o *fuse.MountOptions, init []byte) ([]byte, error) {
	quiet := *o
	// The retired server reports its failed read; nothing to tell.
	quiet.Logger = log.New(io.Discard, "", 0)
	srv, fdNum, reply, err := handshake(fuse.NewDefaultRawFileSystem(), &quiet, init)
	if err != nil {
		return nil, err
	}
	if err := retire(srv, fdNum); err != nil {
		return nil, err
	}
	return reply, nil
}

// Unmount detaches the filesystem at dir. Once nothing uses it (an open
// file, an overlay that has it as a lower dir), the kernel ends the
// connection: the server's reads fail with ENODEV and its Wait returns.
func Unmount(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount FUSE at %s: %w", dir, err)
	}
	return nil
}

// readRetry reads once from fd, again after an interrupted read.
func readRetry(fd int, buf []byte) (int, error) {
	for {
		n, err := unix.Read(fd, buf)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}
