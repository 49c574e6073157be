package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

// The unpacker's file system calls: creating files and setting their
// metadata by descriptor or by path.

// finishFile sets a written file's owner, xattrs, mode and times, and
// closes fd, whatever happens. drop hears of each xattr left out.
func finishFile(fd int, hdr *tar.Header, drop func(string)) error {
	err := setFileMeta(fd, hdr, drop)
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	return err
}

func setFileMeta(fd int, hdr *tar.Header, drop func(string)) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		if !strings.HasPrefix(k, paxXattrPrefix) {
			continue
		}
		attr := strings.TrimPrefix(k, paxXattrPrefix)
		if !allowedXattr(attr) {
			drop(attr)
			continue
		}
		if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
	}
	// After chown, which clears setuid/setgid bits.
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return futimes(fd, hdr)
}

// createExcl creates target, which must not exist, for writing. The
// descriptor stays a plain int: an *os.File would try to register it with
// the runtime's poller (four fcntl and an epoll_ctl per file, all useless
// for a regular file), and unpacks create thousands.
func createExcl(target string) (int, error) {
	for {
		fd, err := unix.Open(target, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "create", Path: target, Err: err}
		}
		return fd, nil
	}
}

// writeAll writes all of p to fd.
func writeAll(fd int, p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("write: %w", io.ErrShortWrite)
		}
		p = p[n:]
	}
	return nil
}

// allowedXattr reports whether a layer may set the xattr name. Only the
// unprivileged namespace, file capabilities and POSIX ACLs: trusted.*
// holds overlayfs's own metadata (trusted.overlay.opaque, .redirect,
// .metacopy would change what the container sees of the layers below;
// berth sets opaque itself, from OCI whiteouts), security.* other than
// capabilities holds LSM labels that are the runtime's to set, and any
// other namespace means nothing to a container.
func allowedXattr(name string) bool {
	switch {
	case strings.HasPrefix(name, "user."):
		return true
	case name == "security.capability", name == "system.posix_acl_access", name == "system.posix_acl_default":
		return true
	}
	return false
}

func setXattrs(target string, hdr *tar.Header, drop func(string)) error {
	for k, v := range hdr.PAXRecords {
		if !strings.HasPrefix(k, paxXattrPrefix) {
			continue
		}
		attr := strings.TrimPrefix(k, paxXattrPrefix)
		if !allowedXattr(attr) {
			drop(attr)
			continue
		}
		if err := unix.Lsetxattr(target, attr, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
	}
	return nil
}

// futimes sets fd's access and modification times (utimensat(fd, NULL)).
func futimes(fd int, hdr *tar.Header) error {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	ts := [2]unix.Timespec{toTimespec(atime), toTimespec(hdr.ModTime)}
	if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); e != 0 {
		return fmt.Errorf("set times: %w", e)
	}
	return nil
}

func isZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// timespecs are hdr's access and modification times for utimensat.
func timespecs(hdr *tar.Header) [2]unix.Timespec {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	return [2]unix.Timespec{toTimespec(atime), toTimespec(hdr.ModTime)}
}

func setTimes(p string, hdr *tar.Header) error {
	ts := timespecs(hdr)
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func toTimespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

// countingReader counts the bytes of a layer's tar stream and fails once
// they pass max (when max is set): a stream of zeros that decompresses
// without end is cut there.
type countingReader struct {
	r     io.Reader
	n     int64
	max   int64
	layer string
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.max > 0 {
		if c.n > c.max {
			return 0, c.tooBig()
		}
		if rest := c.max - c.n + 1; int64(len(p)) > rest {
			p = p[:rest]
		}
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.max > 0 && c.n > c.max {
		return n, c.tooBig()
	}
	return n, err
}

func (c *countingReader) tooBig() error {
	return fmt.Errorf("layer %s: uncompressed stream of more than %d bytes, over the limit image_limits.max_layer_size: %w", c.layer, c.max, errdefs.ErrResourceExhausted)
}
