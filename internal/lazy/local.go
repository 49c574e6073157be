package lazy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/stargz-snapshotter/estargz"
	"golang.org/x/sys/unix"
)

// Local files (decision 3600, S3). Once the layer's whole blob is on disk
// and verified (UseLocal), Materialize writes each regular file of the
// TOC out, decompressed and checked chunk by chunk against its TOC
// digests, into <cache>/files, one plain file per TOC entry. The
// filesystem then opens those files for new opens: the kernel reads them
// itself through FUSE passthrough (fs.go), or, where passthrough is
// refused, the server reads them with ReadAt. The chunk cache is dropped
// once they are there, so the layer costs on disk its blob and its files,
// as a full pull costs its blob and its unpacked diff.
//
// Crash safety: the files are written into files.tmp-* and renamed to
// files only after syncfs, so a files dir is always complete; a temp dir
// left by a kill -9 is removed when the layer is opened again.

const (
	filesDir       = "files"
	filesTmpPrefix = "files.tmp-"
)

// localName is the name of ent's file in the files dir: a digest of its
// path in the TOC, so that no name from the image reaches the disk.
func localName(ent *estargz.TOCEntry) string {
	h := sha256.Sum256([]byte(ent.Name))
	return hex.EncodeToString(h[:])
}

// removeTempFiles removes what an interrupted Materialize left in dir.
func removeTempFiles(dir string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range es {
		if strings.HasPrefix(e.Name(), filesTmpPrefix) {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// LocalFiles reports whether the layer serves its files from local
// files (Materialize has completed).
func (l *Layer) LocalFiles() bool { return l.files.Load() != nil }

// UseWrittenFiles serves reads from the layer's files if an earlier
// Materialize wrote them (the files dir is renamed into place only when
// whole) and reports whether it does: the cheap half of Materialize.
func (l *Layer) UseWrittenFiles() bool {
	if l.LocalFiles() {
		return true
	}
	if l.local.Load() == nil || l.Corrupt() {
		return false
	}
	final := filepath.Join(l.opts.CacheDir, filesDir)
	if st, err := os.Stat(final); err != nil || !st.IsDir() {
		return false
	}
	l.useFiles(final)
	return true
}

// Materialize writes the layer's regular files into <cache>/files from
// the local blob (UseLocal first) or the chunks already cached, each
// chunk checked against its TOC digest, and then serves reads from them
// and drops the chunk cache. The files the TOC lists may add up to at
// most limit bytes (the layer's unpacked size: a TOC can name the same
// compressed bytes for many files, which would fill the disk). A files
// dir already there (complete: it is renamed into place only when whole)
// is used as it is. On failure nothing is left and reads go on from the
// chunks; a chunk that fails its digest marks the layer corrupt, as a
// read would.
func (l *Layer) Materialize(ctx context.Context, limit int64) (err error) {
	if l.UseWrittenFiles() {
		return nil
	}
	if l.local.Load() == nil {
		return errors.New("materialize lazy layer: its blob is not local")
	}
	if l.Corrupt() {
		return fmt.Errorf("materialize lazy layer: %w", ErrCorrupt)
	}
	final := filepath.Join(l.opts.CacheDir, filesDir)
	tmp, err := os.MkdirTemp(l.opts.CacheDir, filesTmpPrefix)
	if err != nil {
		return fmt.Errorf("materialize lazy layer: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	var ents []*estargz.TOCEntry
	seen := map[*estargz.TOCEntry]bool{}
	l.walk(func(ent *estargz.TOCEntry) {
		if ent.Type == "reg" && !seen[ent] && !isLandmark(ent.Name) {
			seen[ent] = true
			ents = append(ents, ent)
		}
	})
	var total int64
	for _, ent := range ents {
		// Compared before it is added: a hostile size cannot overflow.
		if n := max(ent.Size, 0); n > limit-total {
			return fmt.Errorf("materialize lazy layer: its TOC lists more than the layer's %d unpacked bytes of files", limit)
		} else {
			total += n
		}
	}
	// In blob order: the local blob is read front to back.
	sort.Slice(ents, func(i, j int) bool { return ents[i].Offset < ents[j].Offset })
	buf := make([]byte, 0, 4<<20)
	for _, ent := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		if buf, err = l.writeLocal(ctx, tmp, ent, buf); err != nil {
			return fmt.Errorf("materialize lazy layer: %s: %w", ent.Name, err)
		}
	}
	if err := syncFS(tmp); err != nil {
		return fmt.Errorf("materialize lazy layer: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("materialize lazy layer: %w", err)
	}
	if err := syncDir(l.opts.CacheDir); err != nil {
		l.log.Warn("lazy layer: sync cache dir", "error", err)
	}
	l.useFiles(final)
	return nil
}

// writeLocal writes ent's content into dir, chunk by chunk: from the
// chunk cache, or decoded from the local blob and verified. buf is
// scratch space, returned for the next file.
func (l *Layer) writeLocal(ctx context.Context, dir string, ent *estargz.TOCEntry, buf []byte) ([]byte, error) {
	f, err := os.OpenFile(filepath.Join(dir, localName(ent)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return buf, err
	}
	defer f.Close()
	for off := int64(0); off < ent.Size; {
		ce, ok := l.r.ChunkEntryForOffset(ent.Name, off)
		if !ok || ce.ChunkOffset != off || ce.ChunkSize <= 0 || ce.ChunkSize > ent.Size-off {
			// The TOC's chunks do not tile the file.
			return buf, l.fail(fmt.Errorf("no chunk at offset %d of %d bytes: %w", off, ent.Size, ErrCorrupt))
		}
		data, err := l.chunkForCopy(ctx, ce, buf)
		if err != nil {
			return buf, err
		}
		if _, err := f.Write(data); err != nil {
			return buf, err
		}
		if cap(data) > cap(buf) {
			buf = data[:0]
		}
		off += ce.ChunkSize
	}
	return buf, f.Close()
}

// chunkForCopy is ce's verified data: read whole from the chunk cache
// into buf's space when it is there, else decoded from the local blob.
func (l *Layer) chunkForCopy(ctx context.Context, ce *estargz.TOCEntry, buf []byte) ([]byte, error) {
	if ce.ChunkSize <= maxChunk {
		if int64(cap(buf)) < ce.ChunkSize {
			buf = make([]byte, 0, ce.ChunkSize)
		}
		if cached, err := l.cachePath(ce); err == nil {
			if n, ok := readCached(cached, ce.ChunkSize, buf[:ce.ChunkSize], 0); ok {
				return buf[:n], nil
			}
		}
	}
	return l.fetchChunk(ctx, ce)
}

// useFiles serves reads from the complete files dir and drops the chunk
// cache, which it replaces.
func (l *Layer) useFiles(dir string) {
	l.storeMu.Lock()
	defer l.storeMu.Unlock()
	l.files.Store(&dir)
	es, err := os.ReadDir(l.opts.CacheDir)
	if err != nil {
		l.log.Warn("lazy layer: drop the chunk cache", "error", err)
		return
	}
	for _, e := range es {
		if e.Name() == filesDir || strings.HasPrefix(e.Name(), filesTmpPrefix) {
			continue
		}
		if err := os.Remove(filepath.Join(l.opts.CacheDir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.log.Warn("lazy layer: drop the chunk cache", "error", err)
		}
	}
	l.cached.Store(0)
}

// openLocal opens ent's local file for reading, or nil when the layer
// has none yet.
func (l *Layer) openLocal(ent *estargz.TOCEntry) (*os.File, error) {
	dir := l.files.Load()
	if dir == nil {
		return nil, nil
	}
	return os.Open(filepath.Join(*dir, localName(ent)))
}

// readLocalFile reads p from off of ent's local file, once there is
// one; ok false sends the read to the chunks.
func (l *Layer) readLocalFile(ent *estargz.TOCEntry, p []byte, off int64) (int, bool) {
	f, err := l.openLocal(ent)
	if f == nil || err != nil {
		return 0, false
	}
	defer f.Close()
	n, err := f.ReadAt(p, off)
	if n < len(p) || (err != nil && err != io.EOF) {
		return 0, false
	}
	return n, true
}

// syncFS flushes the filesystem that holds dir, so that what was written
// there is on disk before a rename publishes it.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
