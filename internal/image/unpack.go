package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
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

// Decompress returns a reader of the tar stream in r, detecting gzip and
// zstd by their magic bytes (uncompressed tars pass through).
func Decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read layer header: %w", err)
	}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("open gzip stream: %w", err)
		}
		return zr, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("open zstd stream: %w", err)
		}
		return zr.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
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
	errMu    sync.Mutex
	err      error
}

type fileJob struct {
	hdr    *tar.Header
	target string
	data   []byte
}

// Parallel small-file writes: how many writers, up to what size a file's
// data is read into memory and handed to them, and how many bytes may
// wait for them. Creating names in one directory is serialized by the
// kernel (the directory's lock), and a tar lists a directory's files
// together, so each writer takes whole directories (by a hash of the
// parent's path) and the reader runs ahead by up to parallelBytes, over
// many directories.
const (
	fileWriters     = 4
	maxParallelFile = 256 << 10
	parallelBytes   = 8 << 20
)

// bufPool recycles the data buffers of small files within one unpack, by
// power-of-two size class: a layer of 15 000 small files would otherwise
// allocate (and zero) its whole size again, and keep the garbage
// collector busy. What it holds is bounded by parallelBytes (at most
// twice that, for the rounding up) plus one buffer per class.
type bufPool struct {
	mu   sync.Mutex
	free [bufClasses][][]byte
}

// Size classes: 4 KiB << i, up to maxParallelFile.
const (
	minBufShift = 12
	bufClasses  = 7 // 4 KiB … 256 KiB
)

func bufClass(n int) int {
	c := 0
	for (minBufShift+c) < 63 && 1<<(minBufShift+c) < n {
		c++
	}
	return c
}

// get returns a buffer of length n (≤ maxParallelFile); its content is
// whatever it held before.
func (p *bufPool) get(n int) []byte {
	c := bufClass(n)
	p.mu.Lock()
	if l := len(p.free[c]); l > 0 {
		b := p.free[c][l-1]
		p.free[c] = p.free[c][:l-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<(minBufShift+c))
}

func (p *bufPool) put(b []byte) {
	c := bufClass(cap(b))
	if c >= bufClasses || cap(b) != 1<<(minBufShift+c) {
		return
	}
	p.mu.Lock()
	p.free[c] = append(p.free[c], b[:0])
	p.mu.Unlock()
}

// dispatch hands a small regular file whose data is in job to a writer.
func (u *unpacker) dispatch(rel string, job fileJob) {
	if u.queues == nil {
		u.queues = make([]chan fileJob, fileWriters)
		for i := range u.queues {
			u.queues[i] = make(chan fileJob, 256)
			u.writers.Add(1)
			go u.write(u.queues[i])
		}
	}
	u.pending[rel] = true
	u.made(rel)
	h := fnv.New32a()
	h.Write([]byte(path.Dir(rel)))
	u.queues[h.Sum32()%fileWriters] <- job
}

func (u *unpacker) write(jobs chan fileJob) {
	defer u.writers.Done()
	for job := range jobs {
		err := u.writeSmall(job)
		u.inFlight.Release(int64(len(job.data)))
		u.bufs.put(job.data)
		if err != nil {
			u.errMu.Lock()
			if u.err == nil {
				u.err = fmt.Errorf("layer %s: entry %q: %w", u.layer, job.hdr.Name, err)
			}
			u.errMu.Unlock()
		}
	}
}

func (u *unpacker) writeSmall(job fileJob) error {
	fd, err := createExcl(job.target)
	if err != nil {
		return err
	}
	if err := writeAll(fd, job.data); err != nil {
		unix.Close(fd)
		return err
	}
	return finishFile(fd, job.hdr)
}

// writeErr is the first error of a writer, if any.
func (u *unpacker) writeErr() error {
	u.errMu.Lock()
	defer u.errMu.Unlock()
	return u.err
}

// flush waits until every file handed to the writers is written.
func (u *unpacker) flush() error {
	if u.queues != nil {
		for _, q := range u.queues {
			close(q)
		}
		u.writers.Wait()
		u.queues = nil
	}
	clear(u.pending)
	return u.writeErr()
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
	if base == whiteoutOpaque {
		if err := unix.Lsetxattr(parent, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("layer %s: entry %q: mark opaque: %w", u.layer, hdr.Name, err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
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
		return nil // a hard link shares its target's inode and metadata
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

// finishFile sets a written file's owner, xattrs, mode and times, and
// closes fd, whatever happens.
func finishFile(fd int, hdr *tar.Header) error {
	err := setFileMeta(fd, hdr)
	if cerr := unix.Close(fd); err == nil && cerr != nil {
		err = fmt.Errorf("close: %w", cerr)
	}
	return err
}

func setFileMeta(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	for k, v := range hdr.PAXRecords {
		if !strings.HasPrefix(k, paxXattrPrefix) {
			continue
		}
		attr := strings.TrimPrefix(k, paxXattrPrefix)
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

func setXattrs(target string, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		if !strings.HasPrefix(k, paxXattrPrefix) {
			continue
		}
		attr := strings.TrimPrefix(k, paxXattrPrefix)
		if err := unix.Lsetxattr(target, attr, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
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

func setTimes(p string, hdr *tar.Header) error {
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	ts := []unix.Timespec{toTimespec(atime), toTimespec(hdr.ModTime)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
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

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
