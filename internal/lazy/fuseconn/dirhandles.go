package fuseconn

import (
	"math/rand/v2"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// dirHandles keeps the kernel's directory handles meaningful across
// servers. go-fuse numbers a directory handle by its own table (1, 2, ...):
// a handle a dead server gave, still open in a process (an ls that
// was listing), would be unknown to the new server (EIO), or worse, the
// number of another directory it opened since. So every handle this
// server gives carries its generation (a random 32-bit number, not 0) in
// its high half; a handle of another generation is a previous server's,
// and is opened again here on first use (the directory's listing is the
// same, in the same order, so the kernel's offset seeks to the same
// place). File handles are not translated: the files of a tree served
// here have none (the package comment).
type dirHandles struct {
	fuse.RawFileSystem
	gen uint64

	mu      sync.Mutex
	revived map[uint64]uint64 // a previous server's handle → ours
}

func newDirHandles(raw fuse.RawFileSystem) *dirHandles {
	return &dirHandles{RawFileSystem: raw, gen: uint64(rand.Uint32()|1) << 32, revived: map[uint64]uint64{}}
}

// ours is the handle raw knows for the kernel's handle fh on node.
func (d *dirHandles) ours(cancel <-chan struct{}, node, fh uint64) (uint64, fuse.Status) {
	if fh == 0 {
		return 0, fuse.OK
	}
	if fh&^0xffffffff == d.gen {
		return fh & 0xffffffff, fuse.OK
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.revived[fh]; ok {
		return h, fuse.OK
	}
	var out fuse.OpenOut
	in := fuse.OpenIn{InHeader: fuse.InHeader{NodeId: node}}
	if st := d.RawFileSystem.OpenDir(cancel, &in, &out); !st.Ok() {
		return 0, st
	}
	d.revived[fh] = out.Fh
	return out.Fh, fuse.OK
}

func (d *dirHandles) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := d.RawFileSystem.OpenDir(cancel, in, out)
	if st.Ok() {
		out.Fh |= d.gen
	}
	return st
}

func (d *dirHandles) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = d.ours(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return d.RawFileSystem.ReadDir(cancel, &r, out)
}

func (d *dirHandles) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = d.ours(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return d.RawFileSystem.ReadDirPlus(cancel, &r, out)
}

func (d *dirHandles) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = d.ours(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return d.RawFileSystem.FsyncDir(cancel, &r)
}

func (d *dirHandles) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	r := *in
	var st fuse.Status
	if r.Fh, st = d.ours(cancel, in.NodeId, in.Fh); !st.Ok() {
		return st
	}
	return d.RawFileSystem.Ioctl(cancel, &r, inbuf, out, outbuf)
}

func (d *dirHandles) ReleaseDir(in *fuse.ReleaseIn) {
	r := *in
	switch {
	case in.Fh&^0xffffffff == d.gen:
		r.Fh &= 0xffffffff
	default:
		d.mu.Lock()
		h, ok := d.revived[in.Fh]
		delete(d.revived, in.Fh)
		d.mu.Unlock()
		if !ok {
			// A previous server's handle never used here: nothing to
			// release.
			return
		}
		r.Fh = h
	}
	d.RawFileSystem.ReleaseDir(&r)
}
