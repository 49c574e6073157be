package image

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
)

// contentStore holds blobs by digest (manifests, configs, compressed
// layers) in blobs/sha256/<hex>, and the work in progress of pulls and
// imports in ingest/ (emptied by Open). It is containerd's content store,
// cut to what berth needs: a blob appears by one rename of a complete file
// whose digest was checked, so a blob on disk is always whole and
// verified; it disappears by one unlink, which only the collector does
// (gc.go), deciding under the index's and references' locks.
//
// It has no lock and no state beyond its directory: every operation is
// one filesystem call that is atomic on its own.
type contentStore struct {
	dir string // the store root, <berth root>/images
}

func (c *contentStore) path(elem ...string) string {
	return filepath.Join(append([]string{c.dir}, elem...)...)
}

func (c *contentStore) blobsDir() string { return c.path("blobs", "sha256") }

func (c *contentStore) blobPath(digest string) string {
	return filepath.Join(c.blobsDir(), strings.TrimPrefix(digest, "sha256:"))
}

// has reports whether the blob is stored.
func (c *contentStore) has(digest string) bool {
	_, err := os.Stat(c.blobPath(digest))
	return err == nil
}

func (c *contentStore) open(digest string) (*os.File, error) { return os.Open(c.blobPath(digest)) }

func (c *contentStore) read(digest string) ([]byte, error) { return os.ReadFile(c.blobPath(digest)) }

func (c *contentStore) size(digest string) (int64, error) {
	fi, err := os.Stat(c.blobPath(digest))
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// list is every stored blob, by hex.
func (c *contentStore) list() ([]os.DirEntry, error) {
	es, err := os.ReadDir(c.blobsDir())
	if err != nil {
		return nil, fmt.Errorf("read image blobs: %w", err)
	}
	return es, nil
}

// remove deletes the blob named by hex (the collector's sweep).
func (c *contentStore) remove(hexName string) error {
	if err := os.Remove(filepath.Join(c.blobsDir(), hexName)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// ingestPath is a fresh name in ingest/ for work on key (a digest or chain
// ID): ingest/<kind>-<hex>-<random>.
func (c *contentStore) ingestPath(kind, key string) string {
	return c.path("ingest", kind+"-"+strings.TrimPrefix(key, "sha256:")+"-"+randomHex())
}

// writeBlob stores a small blob (manifest, config) after checking its
// digest. Not synced: commit's sync does that before the record.
func (c *contentStore) writeBlob(digest string, data []byte) error {
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return fmt.Errorf("blob %s: content has digest %s: %w", digest, got, errdefs.ErrInvalidArgument)
	}
	if c.has(digest) {
		return nil
	}
	tmp := c.ingestPath("blob", digest)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		// A write cut short (a full disk) leaves the file: nothing
		// else would remove it before the next start (issue 35).
		os.Remove(tmp)
		return fmt.Errorf("store blob %s: %w", digest, err)
	}
	if err := os.Rename(tmp, c.blobPath(digest)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("store blob %s: %w", digest, err)
	}
	return nil
}

// sync flushes the filesystem holding the store (syncfs(2)): the blobs
// and layer files written since are on disk when it returns.
func (c *contentStore) sync() error {
	f, err := os.Open(c.dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync image store: %w", err)
	}
	return nil
}

// ingest is one blob being written into the content store, a file in
// ingest/: what is written is hashed and counted as it goes; commit checks
// size and digest and renames the file into blobs/, abort removes it. Not
// synced: the pull's one syncfs covers it (decision 1510). Used by one
// goroutine at a time.
type ingest struct {
	c      *contentStore
	digest string // what the content must hash to
	path   string
	f      *os.File
	h      hash.Hash
	n      int64
	done   bool // committed or aborted
	// committed: the file is the blob in blobs/ now.
	committed bool
	// keep: a lazy layer's partial blob (resumeIngest), which abort
	// leaves for the next try; discard removes it. prefixPath records
	// how much of it a ranged fetch wrote.
	keep       bool
	prefixPath string
	gone       bool // committed or discarded: no partial blob left
}

// newIngest starts writing the blob digest.
func (c *contentStore) newIngest(digest string) (*ingest, error) {
	p := c.ingestPath("blob", digest)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start blob %s: %w", digest, err)
	}
	return &ingest{c: c, digest: digest, path: p, f: f, h: sha256.New()}, nil
}

// resumeIngest continues writing the blob digest (of size bytes) into
// path, a lazy layer's partial blob: have is how many bytes at its start
// are the blob's as far as the file says. A ranged fetch (rangefetch.go)
// sizes its file at once and writes it at offsets, so it records the
// prefix it wrote in prefixPath, which then says; else the file was
// written in order and its size says. A file larger than the blob is
// not the blob's start: emptied. The bytes already there are not
// hashed yet: the fetch reads them back through hashing.
func (c *contentStore) resumeIngest(digest, path, prefixPath string, size int64) (w *ingest, have int64, err error) {
	// Anything but a regular file there (a link, a dir) is not a
	// partial blob: removed, not followed.
	if st, err := os.Lstat(path); err == nil && !st.Mode().IsRegular() {
		if err := os.RemoveAll(path); err != nil {
			return nil, 0, fmt.Errorf("start blob %s: %w", digest, err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("start blob %s: %w", digest, err)
	}
	w = &ingest{c: c, digest: digest, path: path, prefixPath: prefixPath, f: f, h: sha256.New(), keep: true}
	if n, ok := readPrefix(prefixPath); ok && n <= size {
		return w, n, nil
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("start blob %s: %w", digest, err)
	}
	have = st.Size()
	if have > size {
		have = 0
	}
	if err := w.restartAt(have); err != nil {
		f.Close()
		return nil, 0, err
	}
	return w, have, nil
}

// readPrefix reads a prefix record: a decimal number of at most 19
// digits (anything longer or else is no record).
func readPrefix(path string) (int64, bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 32))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n, err == nil && n >= 0
}

// recordPrefix says that the first n bytes of the partial blob are
// written (a ranged fetch's file).
func (w *ingest) recordPrefix(n int64) error {
	return atomicfile.Write(w.prefixPath, []byte(strconv.FormatInt(n, 10)+"\n"), 0o600)
}

// restartAt cuts the file to its first off bytes and writes on from
// there, in order (no prefix record: its size says).
func (w *ingest) restartAt(off int64) error {
	if w.prefixPath != "" {
		if err := os.Remove(w.prefixPath); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("blob %s: %w", w.digest, err)
		}
	}
	if err := w.f.Truncate(off); err != nil {
		return fmt.Errorf("blob %s: cut partial blob: %w", w.digest, err)
	}
	if _, err := w.f.Seek(off, io.SeekStart); err != nil {
		return fmt.Errorf("blob %s: cut partial blob: %w", w.digest, err)
	}
	return nil
}

func (w *ingest) Write(p []byte) (int, error) {
	w.h.Write(p)
	n, err := w.f.Write(p)
	w.n += int64(n)
	return n, err
}

// hashing is a writer that hashes and counts p as the blob's next bytes
// without writing them: a ranged fetch writes the file at offsets itself
// (writeAt) and hashes what its reader reads back in order.
func (w *ingest) hashing() io.Writer { return ingestHash{w} }

type ingestHash struct{ w *ingest }

func (h ingestHash) Write(p []byte) (int, error) {
	h.w.h.Write(p)
	h.w.n += int64(len(p))
	return len(p), nil
}

// sum is the digest of what was written so far.
func (w *ingest) sum() string { return "sha256:" + hex.EncodeToString(w.h.Sum(nil)) }

// commit checks that the blob had size bytes and hashes to its digest,
// and only then moves it into blobs/. what names the blob in errors
// ("layer"); tamper, if set (fault injection), may replace the digest
// computed. On a mismatch the ingest stays, for abort.
func (w *ingest) commit(what string, size int64, tamper func(got string) string) error {
	if w.n != size {
		return fmt.Errorf("%s %s: received %d bytes, the manifest says %d: %w", what, w.digest, w.n, size, errdefs.ErrInvalidArgument)
	}
	got := w.sum()
	if tamper != nil {
		got = tamper(got)
	}
	if got != w.digest {
		return fmt.Errorf("%s %s: downloaded content has digest %s: %w", what, w.digest, got, errdefs.ErrInvalidArgument)
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("store blob %s: %w", w.digest, err)
	}
	if err := os.Rename(w.path, w.c.blobPath(w.digest)); err != nil {
		return fmt.Errorf("store blob %s: %w", w.digest, err)
	}
	w.done, w.committed, w.gone = true, true, true
	if w.prefixPath != "" {
		os.Remove(w.prefixPath)
	}
	return nil
}

// abort removes what was written, unless the blob was committed or is
// a partial blob kept for the next try (which it only closes).
func (w *ingest) abort() {
	if w.done {
		return
	}
	w.done = true
	w.f.Close()
	if !w.keep {
		os.Remove(w.path)
	}
}

// discard removes what was written, even a partial blob kept for the
// next try, unless the blob was committed.
func (w *ingest) discard() {
	if w.committed {
		return
	}
	w.gone = true
	if !w.done {
		w.done = true
		w.f.Close()
	}
	os.Remove(w.path)
	if w.prefixPath != "" {
		os.Remove(w.prefixPath)
	}
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
