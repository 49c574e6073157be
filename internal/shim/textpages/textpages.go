// Package textpages lets a berth-shim process unmap the pages of its own
// binary that it no longer runs (decision 3100). The kernel maps a static
// Go binary's text and read-only data into a process as it runs them, 64
// KiB around each page touched (fault-around), and leaves them mapped for
// the process's life: the node's keeper and monitor, having started, map
// nearly all 2.2 MiB of berth-shim between them, though once started the
// keeper sleeps in wait4 and the monitor runs its log path. Release drops
// those mappings (madvise MADV_DONTNEED on the binary's read-only,
// file-backed mappings, never on .data or anything writable): the pages
// stay in the page cache, clean, for the kernel to reclaim first when it
// needs memory, and the code the process runs next faults its pages back
// in from there (minor faults, microseconds). What the process keeps
// mapped is then what it ran since, which is what PSS counts.
package textpages

import (
	"bytes"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	once   sync.Once
	ranges [4][2]uintptr // the binary's read-only mappings: [start, end)
	nrange int
)

// Find reads the process's read-only mappings of its own binary from
// /proc/self/maps, once; Release finds them itself if need be. Call it
// early (before the process serves): Release then allocates nothing. Find
// itself allocates nothing either (stack buffers, no bufio or strings), so
// that it brings no size class of its own into the heap (decision 1700).
func Find() {
	once.Do(find)
}

// The paths find opens, NUL-ended for the raw system calls: unix.Open
// and unix.Readlink would copy a Go string to the heap.
var (
	procSelfExe  = [...]byte{'/', 'p', 'r', 'o', 'c', '/', 's', 'e', 'l', 'f', '/', 'e', 'x', 'e', 0}
	procSelfMaps = [...]byte{'/', 'p', 'r', 'o', 'c', '/', 's', 'e', 'l', 'f', '/', 'm', 'a', 'p', 's', 0}
)

// atFdcwd is unix.AT_FDCWD (-100) as a system call argument.
const atFdcwd = ^uintptr(-unix.AT_FDCWD - 1)

// find's buffers, not on its stack: ~3 KiB there would grow the calling
// goroutine's stack for good (a bigger stack, the old one pooled).
var (
	exeBuf [1024]byte
	chunk  [512]byte
	line   [1024]byte
	elfHdr [18]byte
)

// fixedAddress tells from the start of an ELF header whether the binary
// is linked at a fixed address (ET_EXEC, the Go toolchain's default on
// linux/amd64). A position-independent one (ET_DYN: -buildmode=pie, as
// some distributions build) has a read-only mapping whose pages the
// dynamic loader wrote (relocations, then mprotect: RELRO); dropping
// those would read back the unrelocated file, so nothing is released.
func fixedAddress(hdr []byte) bool {
	const etExec = 2
	return len(hdr) >= 18 && string(hdr[:4]) == "\x7fELF" && hdr[5] == 1 && // little-endian
		uint16(hdr[16])|uint16(hdr[17])<<8 == etExec
}

func find() {
	r, _, errno := unix.Syscall6(unix.SYS_OPENAT, atFdcwd, uintptr(unsafe.Pointer(&procSelfExe[0])),
		uintptr(unix.O_RDONLY|unix.O_CLOEXEC), 0, 0, 0)
	if errno != 0 {
		return
	}
	k, err := unix.Pread(int(r), elfHdr[:], 0)
	unix.Close(int(r))
	if err != nil || !fixedAddress(elfHdr[:k]) {
		return
	}
	n, _, errno := unix.Syscall6(unix.SYS_READLINKAT, atFdcwd, uintptr(unsafe.Pointer(&procSelfExe[0])),
		uintptr(unsafe.Pointer(&exeBuf[0])), uintptr(len(exeBuf)), 0, 0)
	if errno != 0 || n == 0 || n >= uintptr(len(exeBuf)) {
		return
	}
	exe := exeBuf[:n]
	r, _, errno = unix.Syscall6(unix.SYS_OPENAT, atFdcwd, uintptr(unsafe.Pointer(&procSelfMaps[0])),
		uintptr(unix.O_RDONLY|unix.O_CLOEXEC), 0, 0, 0)
	if errno != 0 {
		return
	}
	fd := int(r)
	defer unix.Close(fd)
	// Lines longer than line (a mapping of some other, long path) are
	// skipped; the binary's own are shorter than line unless its path is
	// nearly as long as exeBuf allows, and then nothing is released.
	ln, long := 0, false
	for {
		k, err := unix.Read(fd, chunk[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			return
		}
		for _, c := range chunk[:k] {
			if c != '\n' {
				if ln < len(line) {
					line[ln] = c
					ln++
				} else {
					long = true
				}
				continue
			}
			if !long {
				addMapping(line[:ln], exe)
			}
			ln, long = 0, false
		}
	}
}

// addMapping records a maps line (start-end perms offset dev inode path)
// if it maps exe read-only.
func addMapping(l, exe []byte) {
	if nrange == len(ranges) {
		return
	}
	var fields [6][]byte
	f := 0
	for f < len(fields) {
		for len(l) > 0 && l[0] == ' ' {
			l = l[1:]
		}
		if len(l) == 0 {
			return
		}
		end := bytes.IndexByte(l, ' ')
		if end < 0 || f == len(fields)-1 {
			end = len(l) // the path runs to the end of the line
		}
		fields[f], l = l[:end], l[end:]
		f++
	}
	if !bytes.Equal(fields[5], exe) || !bytes.HasPrefix(fields[1], []byte("r-")) {
		return
	}
	dash := bytes.IndexByte(fields[0], '-')
	if dash < 0 {
		return
	}
	lo, ok1 := parseHex(fields[0][:dash])
	hi, ok2 := parseHex(fields[0][dash+1:])
	if !ok1 || !ok2 || hi <= lo {
		return
	}
	ranges[nrange] = [2]uintptr{lo, hi}
	nrange++
}

func parseHex(b []byte) (uintptr, bool) {
	var v uintptr
	if len(b) == 0 || len(b) > 16 {
		return 0, false
	}
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | uintptr(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | uintptr(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// Release unmaps the binary's read-only pages from the process (they stay
// in the page cache); the code that runs next maps back what it touches.
// It is safe at any time, from any goroutine: those pages are never
// written, so the next fault reads them back as they were.
func Release() {
	Find()
	for _, r := range ranges[:nrange] {
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, r[0], r[1]-r[0], unix.MADV_DONTNEED)
	}
}
