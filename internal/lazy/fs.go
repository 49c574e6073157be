package lazy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy/fuseconn"
)

// The filesystem: the TOC's tree, read-only, in the form overlayfs takes
// as a lower dir. OCI whiteouts become overlay whiteouts (a 0/0 character
// device in place of `.wh.<name>`) and `.wh..wh..opq` the opaque xattr on
// its directory, as the unpacker makes them for a full pull; the format's
// own landmark files are hidden.

// OCI whiteout names (image-spec layer.md) and the overlayfs xattr.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
)

// cacheTTL is how long the kernel keeps entries and attributes: the tree
// never changes.
const cacheTTL = time.Hour

// node is one entry of the tree: a TOC entry, or a whiteout (ent nil).
type node struct {
	fs.Inode
	l      *Layer
	ent    *estargz.TOCEntry
	opaque bool
}

var (
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeReader      = (*node)(nil)
	_ fs.NodeReadlinker  = (*node)(nil)
	_ fs.NodeGetxattrer  = (*node)(nil)
	_ fs.NodeListxattrer = (*node)(nil)
	_ fs.NodeOnAdder     = (*rootNode)(nil)

	_ fuseconn.BackingFiler = (*node)(nil)
)

// rootNode builds the tree when it is mounted.
type rootNode struct {
	node
}

func (r *rootNode) OnAdd(ctx context.Context) {
	inodes := map[*estargz.TOCEntry]*fs.Inode{}
	next := uint64(2) // 1 is the root's
	var add func(parent *fs.Inode, pn *node, dir *estargz.TOCEntry)
	add = func(parent *fs.Inode, pn *node, dir *estargz.TOCEntry) {
		forEachChildSorted(dir, func(name string, ent *estargz.TOCEntry) bool {
			switch {
			case parent == &r.Inode && isLandmark(name):
				return true
			case name == whiteoutOpaque:
				pn.opaque = true
				return true
			case strings.HasPrefix(name, whiteoutPrefix):
				victim := strings.TrimPrefix(name, whiteoutPrefix)
				if victim == "" || victim == "." || victim == ".." {
					return true
				}
				wh := parent.NewPersistentInode(ctx, &node{l: r.l}, fs.StableAttr{Mode: syscall.S_IFCHR, Ino: next})
				next++
				parent.AddChild(victim, wh, false)
				return true
			}
			if ino, ok := inodes[ent]; ok {
				// A hard link: the same inode under another name.
				parent.AddChild(name, ino, false)
				return true
			}
			n := &node{l: r.l, ent: ent}
			ino := parent.NewPersistentInode(ctx, n, fs.StableAttr{Mode: typeBits(ent), Ino: next})
			next++
			inodes[ent] = ino
			parent.AddChild(name, ino, false)
			if ent.Type == "dir" {
				add(ino, n, ent)
			}
			return true
		})
	}
	add(&r.Inode, &r.node, r.ent)
}

// typeBits is the file type of ent in st_mode.
func typeBits(ent *estargz.TOCEntry) uint32 {
	switch ent.Type {
	case "dir":
		return syscall.S_IFDIR
	case "symlink":
		return syscall.S_IFLNK
	case "char":
		return syscall.S_IFCHR
	case "block":
		return syscall.S_IFBLK
	case "fifo":
		return syscall.S_IFIFO
	}
	return syscall.S_IFREG
}

func (n *node) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Ino = n.StableAttr().Ino
	out.SetTimeout(cacheTTL)
	if n.ent == nil {
		// An overlay whiteout: a character device 0/0.
		out.Mode = syscall.S_IFCHR
		out.Nlink = 1
		return 0
	}
	e := n.ent
	out.Mode = typeBits(e) | uint32(e.Mode&0o7777)
	out.Uid, out.Gid = uint32(e.UID), uint32(e.GID)
	out.Nlink = uint32(max(e.NumLink, 1))
	switch e.Type {
	case "reg":
		out.Size = uint64(e.Size)
	case "symlink":
		out.Size = uint64(len(e.LinkName))
	case "dir":
		out.Size = 4096
	case "char", "block":
		out.Rdev = uint32(unix.Mkdev(uint32(e.DevMajor), uint32(e.DevMinor)))
	}
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 4096
	mt := e.ModTime()
	out.SetTimes(&mt, &mt, &mt)
	return 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	// The content never changes: the kernel may keep it across opens.
	if n.ent != nil && n.ent.Type == "reg" {
		h, local := n.l.openHandle(n.ent)
		if local && n.l.held.Load() {
			// fuseconn registers the backing file (BackingFile) or answers
			// in cached mode, which the handle serves too.
			return h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_PASSTHROUGH, 0
		}
		return h, fuse.FOPEN_KEEP_CACHE, 0
	}
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

// BackingFile is the node's local file, for fuseconn to register as the
// backing file of its passthrough opens (fuseconn.BackingFiler).
func (n *node) BackingFile() (*os.File, error) {
	if n.ent == nil || n.ent.Type != "reg" {
		return nil, fmt.Errorf("lazy layer: backing file of a node that is not a regular file")
	}
	f, err := n.l.openLocal(n.ent)
	if err == nil && f == nil {
		err = fmt.Errorf("lazy layer: %s has no local file", n.ent.Name)
	}
	return f, err
}

func (n *node) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if n.ent == nil || n.ent.Type != "reg" {
		return nil, syscall.EINVAL
	}
	n.l.servedReads.Add(1)
	switch h := fh.(type) {
	case *localHandle:
		return h.read(dest, off)
	case passthroughHandle:
		return h.read(dest, off)
	}
	got, err := n.l.ReadFile(ctx, n.ent, dest, off)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			n.l.log.Warn("lazy layer: read failed", "file", n.ent.Name, "offset", off, "error", err)
		}
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if n.ent == nil || n.ent.Type != "symlink" {
		return nil, syscall.EINVAL
	}
	return []byte(n.ent.LinkName), 0
}

// xattrs are the node's extended attributes: those of the TOC entry that
// a full pull keeps (decision 3420's allow-list), and the overlay opaque
// mark.
func (n *node) xattrs() map[string][]byte {
	out := map[string][]byte{}
	if n.ent != nil {
		for k, v := range n.ent.Xattrs {
			if xattrAllowed(k) {
				out[k] = v
			}
		}
	}
	if n.opaque {
		out[opaqueXattr] = []byte("y")
	}
	return out
}

// xattrAllowed is the unpacker's allow-list (decision 3420).
func xattrAllowed(name string) bool {
	switch name {
	case "security.capability", "system.posix_acl_access", "system.posix_acl_default":
		return true
	}
	return strings.HasPrefix(name, "user.")
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	v, ok := n.xattrs()[attr]
	if !ok {
		return 0, syscall.ENODATA
	}
	if len(dest) == 0 {
		return uint32(len(v)), 0
	}
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var list []byte
	for k := range n.xattrs() {
		list = append(append(list, k...), 0)
	}
	if len(dest) == 0 {
		return uint32(len(list)), 0
	}
	if len(dest) < len(list) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}

// HeldOptions are the options of a layer's filesystem on a connection
// that outlives its server (fuseconn, decision 3600 S4): the mount
// (fuseconn.Mount, with its MountOptions) and every server of it
// (fuseconn.Serve) must use the same, or the server is refused. Mount
// adds the direct-mount fields, which fuseconn does itself.
func HeldOptions() *fs.Options {
	ttl := cacheTTL
	return &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther: true,
			// Read-only; nosuid,nodev as berth's other mounts where
			// nothing needs otherwise (overlayfs recognizes a whiteout by
			// its type, not by opening it).
			DirectMountFlags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV,
			FsName:           "berth-lazy",
			Name:             "berth",
			Options:          []string{"default_permissions"},
			MaxReadAhead:     1 << 20,
		},
		EntryTimeout:    &ttl,
		AttrTimeout:     &ttl,
		NegativeTimeout: &ttl,
	}
}

// Mounted is a layer served at a directory.
type Mounted struct {
	Dir    string
	server *fuse.Server
}

// Mount serves l, read-only, at dir (a directory that exists), for every
// user of the node (the kernel checks permissions from the TOC's modes:
// default_permissions) until Unmount.
func Mount(dir string, l *Layer) (*Mounted, error) {
	rootEnt, ok := l.Lookup("")
	if !ok {
		return nil, fmt.Errorf("mount lazy layer at %s: the TOC has no root", dir)
	}
	root := &rootNode{node: node{l: l, ent: rootEnt}}
	opts := HeldOptions()
	opts.DirectMount = true
	opts.DirectMountStrict = true
	srv, err := fs.Mount(dir, root, opts)
	if err != nil {
		return nil, fmt.Errorf("mount lazy layer at %s: %w", dir, err)
	}
	return &Mounted{Dir: dir, server: srv}, nil
}

// Unmount detaches the filesystem from the tree. It does not wait for the
// server: an overlay that still has the layer as a lower dir (a container
// on its way out, in a mount namespace of its own) keeps the kernel's
// connection, and the server with it, until it lets go; go-fuse's own
// Unmount would wait for that, and hold whoever called it.
func (m *Mounted) Unmount() error {
	if err := unix.Unmount(m.Dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount lazy layer %s: %w", m.Dir, err)
	}
	return nil
}
