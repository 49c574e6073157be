package lazy_test

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/fuseconn"
)

// inodes maps every path of a layer's tree to its inode number, as a
// server built it.
func inodes(t *testing.T, blob []byte, toc string) map[string]uint64 {
	t.Helper()
	l := openLayer(t, &memSource{blob: blob}, toc, lazy.Options{CacheDir: t.TempDir()})
	root, err := lazy.Tree(l)
	if err != nil {
		t.Fatal(err)
	}
	fs.NewNodeFS(root, &fs.Options{ExternalNodeID: true}) // builds it
	out := map[string]uint64{}
	var walk func(dir *fs.Inode, path string)
	walk = func(dir *fs.Inode, path string) {
		for name, ch := range dir.Children() {
			out[path+name] = ch.StableAttr().Ino
			if ch.IsDir() {
				walk(ch, path+name+"/")
			}
		}
	}
	walk(root.EmbeddedInode(), "")
	return out
}

// Two opens of a layer (two server processes, one after the other) number
// its tree alike, so node IDs that are inode numbers name the same entries
// to both.
func TestTreeNumbersEntriesAlikeInEveryServer(t *testing.T) {
	blob, toc := testLayer(t)
	a, b := inodes(t, blob, toc), inodes(t, blob, toc)
	if len(a) < 10 {
		t.Fatalf("tree of %d entries: %v", len(a), a)
	}
	seen := map[uint64]string{}
	for path, ino := range a {
		if b[path] != ino {
			t.Errorf("%s: inode %d, then %d", path, ino, b[path])
		}
		if ino < 2 {
			t.Errorf("%s: inode %d (1 is the root's node ID)", path, ino)
		}
		if other, ok := seen[ino]; ok && path != "data/hard" && other != "data/hard" {
			t.Errorf("%s and %s share inode %d", path, other, ino)
		}
		seen[ino] = path
	}
}

// The layer's tree served through fuseconn (a mount made by the parent,
// node IDs that are inode numbers, every node registered up front) reads
// as lazy.Mount serves it. Raw system calls: os.Open would register the
// file with the runtime's epoll, whose first FUSE_POLL this very process
// would have to answer (fuseconn's package comment).
func TestTreeServedOnAHeldConnection(t *testing.T) {
	requireFUSE(t)
	blob, toc := testLayer(t)
	l := openLayer(t, &memSource{blob: blob}, toc, lazy.Options{CacheDir: t.TempDir()})
	root, err := lazy.Tree(l)
	if err != nil {
		t.Fatal(err)
	}
	mo := fuse.MountOptions{
		AllowOther:       true,
		DirectMountFlags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV,
		FsName:           "berth-lazy",
		Name:             "berth",
		Options:          []string{"default_permissions"},
		MaxReadAhead:     1 << 20,
	}
	dir := t.TempDir()
	dev, s, err := fuseconn.Mount(dir, &mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fuseconn.Unmount(dir)
		dev.Close()
	})
	ttl := time.Hour
	srv, err := fuseconn.Serve(dev, s, root, &fs.Options{MountOptions: mo, EntryTimeout: &ttl, AttrTimeout: &ttl, NegativeTimeout: &ttl}, "")
	if err != nil {
		t.Fatal(err)
	}

	fd, err := unix.Open(filepath.Join(dir, "data/weights"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(weights))
	n, err := unix.Pread(fd, got, 0)
	unix.Close(fd)
	if err != nil || n != len(weights) || !bytes.Equal(got, weights) {
		t.Fatalf("data/weights: %d bytes (want %d), %v", n, len(weights), err)
	}
	var a, b, w unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "data/weights"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(dir, "data/hard"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Fatalf("hard link: inodes %d and %d, nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if err := unix.Lstat(filepath.Join(dir, "data/gone"), &w); err != nil || w.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatalf("whiteout data/gone: mode %o, %v", w.Mode, err)
	}
	buf := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(dir, "opq"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opq opaque xattr: %q, %v", buf[:n], err)
	}
	link := make([]byte, 64)
	if n, err := unix.Readlink(filepath.Join(dir, "data/link"), link); err != nil || string(link[:n]) != "weights" {
		t.Fatalf("data/link → %q, %v", link[:n], err)
	}

	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	srv.Wait()
}
