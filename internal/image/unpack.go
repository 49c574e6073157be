package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

// OCI whiteout names (image-spec layer.md) and the overlayfs forms they become.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
	paxXattrPrefix = "SCHILY.xattr."
)

// UnpackOptions bound what a layer may do.
type UnpackOptions struct {
	// MaxFileSize refuses regular files whose size is larger; 0 means no limit.
	MaxFileSize int64
}

// Unpack extracts the uncompressed tar stream r into root, an empty
// directory that becomes one overlayfs lower layer. OCI whiteouts become
// overlay whiteouts (char 0/0) and opaque directories (trusted.overlay.opaque).
// Ownership, modes, xattrs, hardlinks, symlinks and timestamps are kept.
// Entries that would leave root (absolute names, "..", writes or hardlinks
// through symlinks) and device nodes are refused with an error naming the
// layer and the entry; nothing outside root is ever touched. Small regular
// files are written by a few writers in parallel, ordered against every
// later entry that could see them. It returns the number of tar bytes read.
func Unpack(r io.Reader, root, layer string, opts UnpackOptions) (int64, error) {
	return unpack(r, root, layer, opts, maxTrackedNames)
}

// unpack is Unpack keeping track of at most maxNames created names.
func unpack(r io.Reader, root, layer string, opts UnpackOptions, maxNames int) (int64, error) {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	u := &unpacker{root: filepath.Clean(root), layer: layer, opts: opts, dirsOK: map[string]bool{}, buf: make([]byte, 128<<10),
		created: map[string]bool{}, maxNames: maxNames,
		pending: map[string]bool{}, inFlight: semaphore.NewWeighted(parallelBytes)}
	// Whatever happens, no writer is left running when Unpack returns.
	defer u.flush()
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return cr.n, fmt.Errorf("layer %s: read tar: %w", layer, err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return cr.n, err
		}
	}
	if err := u.flush(); err != nil {
		return cr.n, err
	}
	// Directory times last: creating entries inside them changed them.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		if err := setTimes(d.path, d.hdr); err != nil {
			return cr.n, fmt.Errorf("layer %s: entry %q: %w", layer, d.hdr.Name, err)
		}
	}
	return cr.n, nil
}

// unpacker applies one layer's tar stream to an empty directory (the
// layer store's ingest dir for it): containerd's core/unpack and its
// archive applier in one. All but err belong to the goroutine reading the
// tar; the writers it starts touch only their jobs, bufs, inFlight and
// err.
type unpacker struct {
	root  string
	layer string
	opts  UnpackOptions
	dirs  []dirTimes
	// dirsOK holds the relative paths of directories known to be real
	// directories inside root (made by this unpack or checked), so that
	// the thousands of entries of one directory check it once. Anything
	// removed during the unpack empties it.
	dirsOK map[string]bool
	// created holds the relative path of every name this unpack made
	// (files, directories, links, whiteouts). root starts empty, so a name
	// not in it does not exist and needs no lstat before it is created;
	// a name in it may have been removed since, which only means a look.
	// Past maxNames it is dropped (nil) and lstat answers again.
	created  map[string]bool
	maxNames int
	buf      []byte

	// Small regular files are written by a few writers in parallel (file
	// creation dominates an unpack of many small files). pending holds
	// the relative paths handed to them since the last flush: an entry
	// touching one of them, and every removal and hard link, flushes
	// first, so the writers only ever create new names in directories
	// that were checked and cannot change under them.
	pending  map[string]bool
	queues   []chan fileJob // one per writer
	inFlight *semaphore.Weighted
	bufs     bufPool
	writers  sync.WaitGroup
	errMu    sync.Mutex // guards err, set by the writers
	err      error
}

// maxTrackedNames bounds the memory of created (about 100 bytes a name):
// a layer with more names than that is unpacked with an lstat per name.
const maxTrackedNames = 1 << 18

// made records that the unpack created rel.
func (u *unpacker) made(rel string) {
	if u.created == nil {
		return
	}
	if len(u.created) >= u.maxNames {
		u.created = nil
		return
	}
	u.created[rel] = true
}

// mayExist reports whether rel may exist in root: false only for a name
// the unpack never created while it still kept track.
func (u *unpacker) mayExist(rel string) bool {
	return u.created == nil || u.created[rel]
}

// absent reports whether nothing is at target (rel inside root) and no
// writer is about to create it: from the names made, or from an lstat
// once they are no longer tracked.
func (u *unpacker) absent(rel, target string) bool {
	if u.created != nil {
		return !u.created[rel]
	}
	if u.pending[rel] {
		return false
	}
	_, err := os.Lstat(target)
	return errors.Is(err, os.ErrNotExist)
}

// removed forgets the directories known good: target was removed and may
// have been (or held) one of them.
func (u *unpacker) removed() { clear(u.dirsOK) }

type dirTimes struct {
	path string
	hdr  *tar.Header
}

func (u *unpacker) refuse(name, why string) error {
	return fmt.Errorf("layer %s: entry %q: %s: %w", u.layer, name, why, errdefs.ErrInvalidArgument)
}

// cleanName checks an archive path and returns it cleaned and relative.
func (u *unpacker) cleanName(name, what string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", u.refuse(name, what+" is absolute")
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", u.refuse(name, what+` contains ".."`)
		}
	}
	return path.Clean(name), nil
}

// parentDir makes sure every directory of rel's parent exists inside root
// without passing through a symlink, and returns the parent's host path.
// With create false a missing directory is refused instead of made.
func (u *unpacker) parentDir(entry, rel string, create bool) (string, error) {
	dir := path.Dir(rel)
	if dir == "." {
		return u.root, nil
	}
	if u.dirsOK[dir] {
		return filepath.Join(u.root, dir), nil
	}
	cur := u.root
	if dir != "." {
		for _, c := range strings.Split(dir, "/") {
			cur = filepath.Join(cur, c)
			if u.pending[strings.TrimPrefix(cur, u.root+"/")] {
				// A file being written where a directory is wanted:
				// let it exist first, then refuse it as before.
				if err := u.flush(); err != nil {
					return "", err
				}
			}
			fi, err := os.Lstat(cur)
			switch {
			case os.IsNotExist(err) && !create:
				return "", u.refuse(entry, "directory "+strings.TrimPrefix(cur, u.root)+" is not in this layer")
			case os.IsNotExist(err):
				if err := os.Mkdir(cur, 0o755); err != nil {
					return "", fmt.Errorf("layer %s: entry %q: create parent: %w", u.layer, entry, err)
				}
				u.made(strings.TrimPrefix(cur, u.root+"/"))
				continue
			case err != nil:
				return "", fmt.Errorf("layer %s: entry %q: %w", u.layer, entry, err)
			case fi.Mode()&os.ModeSymlink != 0:
				return "", u.refuse(entry, "path goes through symlink "+strings.TrimPrefix(cur, u.root))
			case !fi.IsDir():
				return "", u.refuse(entry, "parent "+strings.TrimPrefix(cur, u.root)+" is not a directory")
			}
		}
	}
	// securejoin resolves the way the kernel would with root as "/"; any
	// difference from the lexical path means a symlink was in the way.
	resolved, err := securejoin.SecureJoin(u.root, dir)
	if err != nil {
		return "", fmt.Errorf("layer %s: entry %q: resolve: %w", u.layer, entry, err)
	}
	if resolved != cur {
		return "", u.refuse(entry, "path resolves outside its lexical location")
	}
	for d := dir; d != "." && !u.dirsOK[d]; d = path.Dir(d) {
		u.dirsOK[d] = true
	}
	return cur, nil
}

// entry applies one tar entry: whiteouts, then regular files (regular),
// then every other kind (special).
func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := u.cleanName(hdr.Name, "name")
	if err != nil {
		return err
	}
	if rel == "." {
		return nil // the layer root itself: its metadata is ours
	}
	parent, err := u.parentDir(hdr.Name, rel, true)
	if err != nil {
		return err
	}
	base := path.Base(rel)
	if base == whiteoutOpaque || strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(hdr, rel, parent, base)
	}
	target := filepath.Join(parent, base)

	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		return u.refuse(hdr.Name, "device nodes are not allowed in layers")
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return u.refuse(hdr.Name, fmt.Sprintf("unsupported tar entry type %q", hdr.Typeflag))
	}
	if hdr.Typeflag == tar.TypeReg && u.opts.MaxFileSize > 0 && hdr.Size > u.opts.MaxFileSize {
		return u.refuse(hdr.Name, fmt.Sprintf("file size %d exceeds the limit %d", hdr.Size, u.opts.MaxFileSize))
	}

	wrap := func(err error) error { return fmt.Errorf("layer %s: entry %q: %w", u.layer, hdr.Name, err) }
	if hdr.Typeflag == tar.TypeReg {
		// Most entries: created and finished through one descriptor.
		return u.regular(hdr, rel, target, r, wrap)
	}
	return u.special(hdr, rel, target, wrap)
}

// whiteout turns an OCI whiteout entry (base, in parent) into its
// overlayfs form: an opaque directory, or a 0/0 char device in place of
// the name it hides.
func (u *unpacker) whiteout(hdr *tar.Header, rel, parent, base string) error {
	if base == whiteoutOpaque {
		if err := unix.Lsetxattr(parent, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("layer %s: entry %q: mark opaque: %w", u.layer, hdr.Name, err)
		}
		return nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return u.refuse(hdr.Name, "bad whiteout")
	}
	target := filepath.Join(parent, victim)
	if _, err := os.Lstat(target); err == nil || u.pending[strings.TrimPrefix(target, u.root+"/")] {
		if err := u.flush(); err != nil {
			return err
		}
	}
	u.removed()
	if err := os.RemoveAll(target); err != nil {
		return fmt.Errorf("layer %s: entry %q: %w", u.layer, hdr.Name, err)
	}
	if err := unix.Mknod(target, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("layer %s: entry %q: create overlay whiteout: %w", u.layer, hdr.Name, err)
	}
	u.made(path.Join(path.Dir(rel), victim))
	return nil
}

// special creates a directory, symlink, fifo or hard link entry at target
// (rel inside root) and, but for hard links, sets its metadata.
func (u *unpacker) special(hdr *tar.Header, rel, target string, wrap func(error) error) error {
	if u.pending[rel] || hdr.Typeflag == tar.TypeLink {
		// Replacing a file being written, or linking to one that may be.
		if err := u.flush(); err != nil {
			return err
		}
	}
	// A later entry replaces an earlier one, except dir over dir.
	if err := u.replace(hdr, rel, target); err != nil {
		return err
	}
	u.made(rel)

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o700); err != nil && !os.IsExist(err) {
			return wrap(err)
		}
		u.dirsOK[rel] = true
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return wrap(err)
		}
	case tar.TypeFifo:
		if err := unix.Mkfifo(target, 0o600); err != nil {
			return wrap(err)
		}
	case tar.TypeLink:
		// A hard link shares its target's inode and metadata.
		return u.hardlink(hdr, target, wrap)
	}

	if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
		return wrap(fmt.Errorf("chown: %w", err))
	}
	if err := setXattrs(target, hdr); err != nil {
		return wrap(err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid/setgid bits.
		if err := unix.Chmod(target, uint32(hdr.Mode&0o7777)); err != nil {
			return wrap(fmt.Errorf("chmod: %w", err))
		}
	}
	if hdr.Typeflag == tar.TypeDir {
		u.dirs = append(u.dirs, dirTimes{path: target, hdr: hdr})
		return nil
	}
	if err := setTimes(target, hdr); err != nil {
		return wrap(err)
	}
	return nil
}

// hardlink links target to the entry's link name, which must be a
// non-directory this layer already holds.
func (u *unpacker) hardlink(hdr *tar.Header, target string, wrap func(error) error) error {
	lrel, err := u.cleanName(hdr.Linkname, "hardlink target")
	if err != nil {
		return err
	}
	if lrel == "." {
		return u.refuse(hdr.Name, "hardlink to the layer root")
	}
	lparent, err := u.parentDir(hdr.Name, lrel, false)
	if err != nil {
		return err
	}
	src := filepath.Join(lparent, path.Base(lrel))
	fi, err := os.Lstat(src)
	if err != nil {
		return u.refuse(hdr.Name, "hardlink target "+hdr.Linkname+" is not in this layer")
	}
	if fi.IsDir() {
		return u.refuse(hdr.Name, "hardlink to a directory")
	}
	if err := os.Link(src, target); err != nil {
		return wrap(err)
	}
	return nil
}

// replace removes what is at target (rel inside root) unless hdr is a
// directory and target one already.
func (u *unpacker) replace(hdr *tar.Header, rel, target string) error {
	if !u.mayExist(rel) {
		return nil // nothing was ever there
	}
	fi, err := os.Lstat(target)
	if err != nil || (fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
		return nil
	}
	// A directory may hold files being written.
	if err := u.flush(); err != nil {
		return err
	}
	if fi.IsDir() {
		u.removed()
	}
	if err := os.RemoveAll(target); err != nil {
		return fmt.Errorf("layer %s: entry %q: replace: %w", u.layer, hdr.Name, err)
	}
	return nil
}

// regular writes a regular file entry and its metadata through one file
// descriptor (no path lookups after the create).
func (u *unpacker) regular(hdr *tar.Header, rel, target string, r io.Reader, wrap func(error) error) error {
	if err := u.writeErr(); err != nil {
		return err
	}
	if hdr.Size <= maxParallelFile && u.absent(rel, target) {
		// A new name (the writer's O_EXCL create makes sure of it).
		// Never fails: the context is not cancelled and the weight is
		// at most the semaphore's size.
		_ = u.inFlight.Acquire(context.Background(), hdr.Size)
		data := u.bufs.get(int(hdr.Size))
		if _, err := io.ReadFull(r, data); err != nil {
			u.bufs.put(data)
			u.inFlight.Release(hdr.Size)
			return wrap(fmt.Errorf("read file data: %w", err))
		}
		u.dispatch(rel, fileJob{hdr: hdr, target: target, data: data})
		return nil
	}
	if u.pending[rel] {
		if err := u.flush(); err != nil {
			return err
		}
	}
	u.made(rel)
	fd, err := createExcl(target)
	if errors.Is(err, os.ErrExist) {
		if err := u.replace(hdr, rel, target); err != nil {
			return err
		}
		fd, err = createExcl(target)
	}
	if err != nil {
		return wrap(err)
	}
	if err := u.writeData(fd, r, hdr.Size); err != nil {
		unix.Close(fd)
		return wrap(err)
	}
	if err := finishFile(fd, hdr); err != nil {
		return wrap(err)
	}
	return nil
}

// writeData copies size bytes into fd, seeking over whole zero buffers so
// that sparse files stay sparse on disk.
func (u *unpacker) writeData(fd int, r io.Reader, size int64) error {
	buf := u.buf
	var written int64
	holeAtEnd := false
	for written < size {
		want := int64(len(buf))
		if size-written < want {
			want = size - written
		}
		n, err := io.ReadFull(r, buf[:want])
		if n > 0 {
			chunk := buf[:n]
			// Only full buffers: a small file is never worth a hole.
			if n == len(buf) && isZero(chunk) {
				if _, err := unix.Seek(fd, int64(n), io.SeekCurrent); err != nil {
					return fmt.Errorf("seek: %w", err)
				}
				holeAtEnd = true
			} else if err := writeAll(fd, chunk); err != nil {
				return err
			} else {
				holeAtEnd = false
			}
			written += int64(n)
		}
		if err != nil {
			return fmt.Errorf("read file data: %w", err)
		}
	}
	if holeAtEnd {
		if err := unix.Ftruncate(fd, size); err != nil {
			return fmt.Errorf("truncate: %w", err)
		}
	}
	return nil
}
