package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

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

// UnpackOptions bound what a layer may do (decision 3420). A zero limit
// is no limit.
type UnpackOptions struct {
	// MaxLayerSize bounds the layer's uncompressed tar stream, and the sum
	// of the apparent sizes of its regular files: a sparse file counts at
	// its full size, from its header, before anything is written.
	MaxLayerSize int64
	// MaxEntries bounds the tar entries of the layer.
	MaxEntries int64
	// MaxDirs bounds the directories the layer creates (each one's times
	// are kept until the end, to be set last).
	MaxDirs int64
	// Image, if set, is shared by the layers of one pull or import: the
	// apparent size of each file counts against it too.
	Image *SizeBudget
	// Log, if set, hears what the unpack leaves out (xattrs dropped).
	Log *slog.Logger
}

// SizeBudget is a byte limit shared by the layers of one image, which
// unpack in parallel.
type SizeBudget struct {
	max  int64
	used atomic.Int64
}

// NewSizeBudget returns a budget of max bytes; max 0 is no limit (nil is
// one too).
func NewSizeBudget(max int64) *SizeBudget { return &SizeBudget{max: max} }

// take counts n more bytes and reports whether the budget still holds.
func (b *SizeBudget) take(n int64) bool {
	if b == nil || b.max <= 0 {
		return true
	}
	return b.used.Add(n) <= b.max
}

// Unpack extracts the uncompressed tar stream r into root, an empty
// directory that becomes one overlayfs lower layer. OCI whiteouts become
// overlay whiteouts (char 0/0) and opaque directories (trusted.overlay.opaque).
// Ownership, modes, hardlinks, symlinks, device nodes and timestamps are
// kept; of the xattrs only the unprivileged ones (allowedXattr). Entries
// that would leave root (absolute names, "..", writes or hardlinks through
// symlinks) are refused with an error naming the layer and the entry;
// nothing outside root is ever touched. A layer past one of opts' limits
// is refused (ErrResourceExhausted) as soon as it is seen, and the unpack
// stops when ctx is cancelled: what it wrote is the caller's to remove.
// Small regular files are written by a few writers in parallel, ordered
// against every later entry that could see them. It returns the number of
// tar bytes read.
func Unpack(ctx context.Context, r io.Reader, root, layer string, opts UnpackOptions) (int64, error) {
	return unpack(ctx, r, root, layer, opts, maxTrackedNames)
}

// unpack is Unpack keeping track of at most maxNames created names.
func unpack(ctx context.Context, r io.Reader, root, layer string, opts UnpackOptions, maxNames int) (int64, error) {
	cr := &countingReader{r: r, max: opts.MaxLayerSize, layer: layer}
	tr := tar.NewReader(cr)
	u := &unpacker{ctx: ctx, root: filepath.Clean(root), layer: layer, opts: opts, dirsOK: map[string]bool{}, buf: make([]byte, 128<<10),
		created: map[string]bool{}, maxNames: maxNames,
		pending: map[string]bool{}, inFlight: semaphore.NewWeighted(parallelBytes)}
	defer u.reportDropped()
	// Whatever happens, no writer is left running when Unpack returns.
	defer u.flush()
	for {
		if err := ctx.Err(); err != nil {
			return cr.n, fmt.Errorf("layer %s: unpack: %w", layer, err)
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return cr.n, fmt.Errorf("layer %s: read tar: %w", layer, err)
		}
		u.entries++
		if u.opts.MaxEntries > 0 && u.entries > u.opts.MaxEntries {
			return cr.n, u.exhausted(hdr.Name, fmt.Sprintf("more than %d entries", u.opts.MaxEntries), "image_limits.max_layer_entries")
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
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, d.path, d.times[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return cr.n, fmt.Errorf("layer %s: directory %q: set times: %w", layer, strings.TrimPrefix(d.path, u.root), err)
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
	// ctx is Unpack's, checked between entries and within long files.
	ctx   context.Context
	root  string
	layer string
	opts  UnpackOptions
	dirs  []dirTimes
	// entries, ndirs and size count the layer's tar entries, the
	// directories it made and the apparent size of its files, against
	// opts' limits.
	entries, ndirs, size int64
	// dropped counts the xattrs left out, by name (the writers drop too).
	dropMu  sync.Mutex
	dropped map[string]int
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

// maxDirsOK bounds dirsOK the same way: it is a cache, emptied when full.
const maxDirsOK = 1 << 16

// dirOK records that rel is a directory checked or made inside root.
func (u *unpacker) dirOK(rel string) {
	if len(u.dirsOK) >= maxDirsOK {
		clear(u.dirsOK)
	}
	u.dirsOK[rel] = true
}

// newDir counts a directory the layer makes against opts.MaxDirs.
func (u *unpacker) newDir(entry string) error {
	u.ndirs++
	if u.opts.MaxDirs > 0 && u.ndirs > u.opts.MaxDirs {
		return u.exhausted(entry, fmt.Sprintf("more than %d directories", u.opts.MaxDirs), "image_limits.max_layer_dirs")
	}
	return nil
}

// drop records that the xattr name was left out (allowedXattr).
func (u *unpacker) drop(name string) {
	u.dropMu.Lock()
	defer u.dropMu.Unlock()
	if u.dropped == nil {
		u.dropped = map[string]int{}
	}
	// A hostile layer may name many: bounded memory, the count goes on.
	if _, ok := u.dropped[name]; ok || len(u.dropped) < 32 {
		u.dropped[name]++
	} else {
		u.dropped["(others)"]++
	}
}

// reportDropped logs, once per layer, the xattrs it left out.
func (u *unpacker) reportDropped() {
	u.dropMu.Lock()
	defer u.dropMu.Unlock()
	if len(u.dropped) == 0 || u.opts.Log == nil {
		return
	}
	u.opts.Log.Warn("layer xattrs dropped: only user.*, security.capability and POSIX ACLs are applied",
		"layer", u.layer, "dropped", u.dropped)
}

// exhausted is the error of a layer past one of its limits: what, and the
// configuration key that sets it.
func (u *unpacker) exhausted(name, what, key string) error {
	return fmt.Errorf("layer %s: entry %q: %s, over the limit %s: %w", u.layer, name, what, key, errdefs.ErrResourceExhausted)
}

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

// dirTimes is a directory's times, kept to be set last: its path and two
// timespecs, not the whole header (a layer may hold a million).
type dirTimes struct {
	path  string
	times [2]unix.Timespec
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
				if err := u.newDir(entry); err != nil {
					return "", err
				}
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
		u.dirOK(d)
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
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	case tar.TypeChar, tar.TypeBlock:
		// Created as containerd does (decision 3420): a container's /dev
		// is a fresh tmpfs and its device rules deny what it was not given.
	default:
		return u.refuse(hdr.Name, fmt.Sprintf("unsupported tar entry type %q", hdr.Typeflag))
	}
	if hdr.Typeflag == tar.TypeReg {
		// The apparent size, from the header: a sparse file of 1 TiB is
		// refused before a byte of it is written.
		if max := u.opts.MaxLayerSize; max > 0 && hdr.Size > max-u.size {
			return u.exhausted(hdr.Name, fmt.Sprintf("files of more than %d bytes", max), "image_limits.max_layer_size")
		}
		u.size += hdr.Size
		if !u.opts.Image.take(hdr.Size) {
			return u.exhausted(hdr.Name, fmt.Sprintf("an image of more than %d bytes", u.opts.Image.max), "image_limits.max_image_size")
		}
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
		} else if err == nil {
			if err := u.newDir(hdr.Name); err != nil {
				return err
			}
		}
		u.dirOK(rel)
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return wrap(err)
		}
	case tar.TypeFifo:
		if err := unix.Mkfifo(target, 0o600); err != nil {
			return wrap(err)
		}
	case tar.TypeChar, tar.TypeBlock:
		mode := uint32(unix.S_IFCHR)
		if hdr.Typeflag == tar.TypeBlock {
			mode = unix.S_IFBLK
		}
		if hdr.Devmajor < 0 || hdr.Devminor < 0 || hdr.Devmajor > 0xfffff || hdr.Devminor > 0xfffff {
			return u.refuse(hdr.Name, fmt.Sprintf("device number %d:%d out of range", hdr.Devmajor, hdr.Devminor))
		}
		if err := unix.Mknod(target, mode|0o600, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			return wrap(fmt.Errorf("create device node: %w", err))
		}
	case tar.TypeLink:
		// A hard link shares its target's inode and metadata.
		return u.hardlink(hdr, target, wrap)
	}

	if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
		return wrap(fmt.Errorf("chown: %w", err))
	}
	if err := setXattrs(target, hdr, u.drop); err != nil {
		return wrap(err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid/setgid bits.
		if err := unix.Chmod(target, uint32(hdr.Mode&0o7777)); err != nil {
			return wrap(fmt.Errorf("chmod: %w", err))
		}
	}
	if hdr.Typeflag == tar.TypeDir {
		u.dirs = append(u.dirs, dirTimes{path: target, times: timespecs(hdr)})
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
	if err := finishFile(fd, hdr, u.drop); err != nil {
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
		// A file may be large (up to the layer limit): the unpack stops
		// within it when its pull is gone.
		if err := u.ctx.Err(); err != nil {
			return err
		}
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
