package fuseconn

import (
	"math/rand/v2"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// handles keeps the kernel's file and directory handles meaningful across
// servers. go-fuse numbers handles by its own table (1, 2, ...): a handle a
// dead server gave, still open in a process, would be unknown to the new
// server (EIO), or worse, the number of another file it opened since. So
// every handle this server gives carries its generation (a random 32-bit
// number, not 0) in its high half, and a handle of another generation is a
// previous server's:
//   - a directory's is opened again here on first use (the directory's
//     listing is the same, in the same order, so go-fuse seeks to the
//     kernel's offset);
//   - a file's is taken as no handle: the tree's node methods serve the
//     request (internal/lazy's read by node), and its release is dropped.
type handles struct {
	fuse.RawFileSystem
	gen uint64
	// backing settles each open's I/O mode (backing.go); set before the
	// server reads its first request. nil: no passthrough.
	backing *backing

	mu      sync.Mutex
	revived map[uint64]uint64 // a previous server's directory handle → ours
}

const lowHalf = 0xffffffff

func newHandles(raw fuse.RawFileSystem) *handles {
	return &handles{RawFileSystem: raw, gen: uint64(rand.Uint32()|1) << 32, revived: map[uint64]uint64{}}
}

func (h *handles) ours(fh uint64) bool { return fh&^lowHalf == h.gen }

// file is the handle raw knows for the kernel's file handle fh (0: none).
func (h *handles) file(fh uint64) uint64 {
	if h.ours(fh) {
		return fh & lowHalf
	}
	return 0
}

// dir is the handle raw knows for the kernel's directory handle fh on
// node, opened now if a previous server gave it.
func (h *handles) dir(cancel <-chan struct{}, node, fh uint64) (uint64, fuse.Status) {
	if fh == 0 || h.ours(fh) {
		return fh & lowHalf, fuse.OK
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ours, ok := h.revived[fh]; ok {
		return ours, fuse.OK
	}
	var out fuse.OpenOut
	in := fuse.OpenIn{InHeader: fuse.InHeader{NodeId: node}}
	if st := h.RawFileSystem.OpenDir(cancel, &in, &out); !st.Ok() {
		return 0, st
	}
	h.revived[fh] = out.Fh
	return out.Fh, fuse.OK
}

func (h *handles) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := h.RawFileSystem.Open(cancel, in, out)
	if !st.Ok() {
		return st
	}
	if h.backing == nil {
		out.OpenFlags &^= fuse.FOPEN_PASSTHROUGH
	} else if err := h.backing.open(in.NodeId, out); err != nil {
		h.backing.log.Printf("open node %d: %v", in.NodeId, err)
		// The kernel sends no RELEASE for an open it is refused.
		if out.Fh != 0 {
			h.RawFileSystem.Release(cancel, &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: in.NodeId}, Fh: out.Fh})
		}
		return fuse.EIO
	}
	if out.Fh != 0 {
		out.Fh |= h.gen
	}
	return st
}

func (h *handles) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.Read(cancel, &r, buf)
}

func (h *handles) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	r := *in
	r.Fh_ = h.file(in.Fh_)
	return h.RawFileSystem.GetAttr(cancel, &r, out)
}

func (h *handles) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.Statx(cancel, &r, out)
}

func (h *handles) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.Lseek(cancel, &r, out)
}

func (h *handles) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.GetLk(cancel, &r, out)
}

func (h *handles) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.SetLk(cancel, &r)
}

func (h *handles) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.SetLkw(cancel, &r)
}

func (h *handles) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.Ioctl(cancel, &r, inbuf, out, outbuf)
}

func (h *handles) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.Flush(cancel, &r)
}

func (h *handles) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	r := *in
	r.Fh = h.file(in.Fh)
	return h.RawFileSystem.Fsync(cancel, &r)
}

func (h *handles) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	if !h.ours(in.Fh) {
		if in.Fh == 0 {
			h.RawFileSystem.Release(cancel, in)
		}
		// A previous server's: nothing of it is here.
		return
	}
	r := *in
	r.Fh &= lowHalf
	h.RawFileSystem.Release(cancel, &r)
}

func (h *handles) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := h.RawFileSystem.OpenDir(cancel, in, out)
	if st.Ok() && out.Fh != 0 {
		out.Fh |= h.gen
	}
	return st
}

func (h *handles) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = h.dir(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return h.RawFileSystem.ReadDir(cancel, &r, out)
}

func (h *handles) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = h.dir(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return h.RawFileSystem.ReadDirPlus(cancel, &r, out)
}

func (h *handles) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = h.dir(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return h.RawFileSystem.FsyncDir(cancel, &r)
}

func (h *handles) ReleaseDir(in *fuse.ReleaseIn) {
	r := *in
	if h.ours(in.Fh) {
		r.Fh &= lowHalf
	} else {
		h.mu.Lock()
		ours, ok := h.revived[in.Fh]
		delete(h.revived, in.Fh)
		h.mu.Unlock()
		if !ok {
			// A previous server's handle never used here: nothing to
			// release.
			return
		}
		r.Fh = ours
	}
	h.RawFileSystem.ReleaseDir(&r)
}
