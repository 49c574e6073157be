package lazy

import (
	"context"
	"errors"
	"io"
	"os"
	"syscall"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Open files of the filesystem (fs.go). A file opened once the layer's
// files are local (local.go) gets a localHandle: go-fuse registers its fd
// with the kernel as the inode's backing file (FOPEN_PASSTHROUGH,
// RegisterBackingFd), and the kernel reads it without asking the server;
// where the kernel or go-fuse refuses (no CAP_PASSTHROUGH, the cache on a
// stacked filesystem, not root), the server answers each read with a
// ReadAt of the same file. Any other open gets a chunkHandle, served
// through Layer.ReadFile.
//
// The kernel holds an inode in one I/O mode at a time: while a file is
// open in its cached mode (a chunkHandle, opened before the files were
// local), a passthrough open of the same inode fails (ETXTBSY, EIO to the
// caller), and the reverse. So a new open gets a localHandle only while
// no chunkHandle of its inode is open; until those close, opens get
// chunkHandles, whose reads also come from the local file by then.

// localHandle is a file open on its local copy. On a layer served
// through fuseconn (Tree), the node's Open asks for passthrough with
// FOPEN_PASSTHROUGH and fuseconn registers the node's local file
// (node.BackingFile) once for the connection's life, so that a server
// that takes the connection over answers with the same backing ID
// (decision 3600, "Passthrough across servers"); on a layer mounted by
// Mount, go-fuse registers the handle's fd (passthroughHandle).
type localHandle struct {
	l *Layer
	f *os.File
}

// passthroughHandle is a localHandle that go-fuse registers (Mount).
type passthroughHandle struct{ *localHandle }

var (
	_ fs.FilePassthroughFder = passthroughHandle{}
	_ fs.FileReleaser        = (*localHandle)(nil)
	_ fs.FileReleaser        = (*chunkHandle)(nil)
)

func (h passthroughHandle) PassthroughFd() (int, bool) { return int(h.f.Fd()), true }

func (h *localHandle) Release(context.Context) syscall.Errno {
	h.f.Close()
	return 0
}

// read is a read the kernel did not pass through.
func (h *localHandle) read(dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if h.l.noPassthrough.CompareAndSwap(false, true) {
		h.l.log.Info("lazy layer: local files read through the FUSE server (not passed through: refused by the kernel, or open in cached mode)")
	}
	n, err := h.f.ReadAt(dest, off)
	if err != nil && !errors.Is(err, io.EOF) {
		h.l.log.Warn("lazy layer: read of a local file failed", "error", err)
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// chunkHandle is a file open in the kernel's cached mode, read through
// Layer.ReadFile.
type chunkHandle struct {
	l   *Layer
	ent *estargz.TOCEntry
}

func (h *chunkHandle) Release(context.Context) syscall.Errno {
	h.l.opensMu.Lock()
	defer h.l.opensMu.Unlock()
	if h.l.cachedOpens[h.ent]--; h.l.cachedOpens[h.ent] <= 0 {
		delete(h.l.cachedOpens, h.ent)
	}
	return 0
}

// openHandle is a new open of the regular file ent; local says it is on
// its local file (a passthrough open, where the kernel takes it).
func (l *Layer) openHandle(ent *estargz.TOCEntry) (h fs.FileHandle, local bool) {
	l.opensMu.Lock()
	defer l.opensMu.Unlock()
	if l.cachedOpens[ent] == 0 {
		f, err := l.openLocal(ent)
		if err != nil {
			l.log.Warn("lazy layer: open a local file", "file", ent.Name, "error", err)
		}
		if f != nil {
			lh := &localHandle{l: l, f: f}
			if l.held.Load() {
				return lh, true
			}
			return passthroughHandle{lh}, true
		}
	}
	if l.cachedOpens == nil {
		l.cachedOpens = map[*estargz.TOCEntry]int{}
	}
	l.cachedOpens[ent]++
	return &chunkHandle{l: l, ent: ent}, false
}

// ServedReads is how many reads of file contents the server answered
// (reads the kernel passed through to a local file are not among them).
func (l *Layer) ServedReads() int64 { return l.servedReads.Load() }

// CanPassthrough reports whether the kernel takes the file at path as a
// passthrough backing file of this mount: a probe, registered and
// unregistered at once.
func (m *Mounted) CanPassthrough(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	id, errno := m.server.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
	if errno != 0 {
		return false
	}
	m.server.UnregisterBackingFd(id)
	return true
}
