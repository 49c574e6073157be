// Package lazy serves eStargz layers before they have arrived (decision
// 3600): a layer's table of contents (TOC) is fetched and verified
// against the digest its manifest names, the files it lists are served
// by a read-only FUSE filesystem (fs.go), and each chunk a reader needs is
// fetched by an HTTP range request and checked against its TOC digest
// before the reader sees it. Once the whole blob is on disk and verified,
// the layer's files are written out and served from there, passed
// through to the kernel where it takes them (local.go, handle.go).
//
// The format is github.com/containerd/stargz-snapshotter/estargz's; this
// package only fetches, verifies and caches.
package lazy

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/klauspost/compress/gzip"
	digest "github.com/opencontainers/go-digest"
)

// Bounds on what a layer's blob may make berthd read into memory. A TOC
// lists every file of the layer: 64 MiB of JSON is several hundred
// thousand entries, far above real images. A chunk is what a reader waits
// for: the format's default is 4 MiB; 64 MiB leaves room for builders
// that choose larger.
const (
	MaxTOCJSON        = 64 << 20
	maxTOCCompressed  = MaxTOCJSON
	maxChunk          = 64 << 20
	maxChunkOnTheWire = maxChunk + maxChunk/64 + 1<<20
)

// ErrCorrupt is a chunk whose bytes do not match its TOC digest.
var ErrCorrupt = errors.New("chunk does not match its TOC digest")

// ErrNoRanges is a source that answers a range request with the whole
// blob: it cannot serve a layer lazily (and is not asked again).
var ErrNoRanges = errors.New("the registry does not serve byte ranges")

// ErrGivenUp is a source's failure that it retried itself (berthd, which
// asks the registry with the pull's retries, on behalf of a lazy-layer
// server): the layer does not ask again, the read fails at once.
var ErrGivenUp = errors.New("the source gave up on the range")

// TOCDigestAnnotation is the layer descriptor annotation naming the
// digest of the layer's TOC JSON.
const TOCDigestAnnotation = estargz.TOCJSONDigestAnnotation

// Source reads one layer blob where it lives (a registry).
type Source interface {
	// Size is the blob's size, as the manifest says.
	Size() int64
	// OpenRange streams the bytes [start, end) of the blob.
	OpenRange(ctx context.Context, start, end int64) (io.ReadCloser, error)
}

// Options shape a layer.
type Options struct {
	// CacheDir holds the verified chunks, one file each by digest.
	CacheDir string
	// Log hears about fetch failures and corruption.
	Log *slog.Logger
	// OnCorrupt is called (once per layer) when a chunk fails its digest.
	OnCorrupt func(error)
	// Retries is how many times a failed range request is asked again
	// (with back-off from RetryDelay, doubling) before a read fails.
	Retries    int
	RetryDelay time.Duration
	// Progress, if set, counts every byte received as it arrives (the
	// pull's progress timeout watches it).
	Progress *atomic.Int64
	// RequestTimeout bounds each range request (0: none but the
	// reader's), so that a registry that stops sending fails the read
	// instead of holding it.
	RequestTimeout time.Duration
}

// Layer is one eStargz layer whose TOC was verified. It is safe for
// concurrent use.
type Layer struct {
	r      *estargz.Reader
	verify estargz.TOCEntryVerifier
	src    Source
	opts   Options
	log    *slog.Logger

	// tocTail is the blob from the TOC's offset to its end (TOC and
	// footer), as fetched and verified: TOCTail.
	tocTail []byte

	corrupt atomic.Bool
	// FetchedBytes counts the bytes fetched from the source.
	fetched atomic.Int64
	// cached counts the bytes of the chunks written to the cache.
	cached atomic.Int64

	mu       sync.Mutex
	inflight map[string]*chunkCall // by chunk digest

	// local is the whole blob on disk, once the background fetch
	// verified it: chunks are read from it instead of the source.
	local atomic.Pointer[os.File]
	// files is the dir of the layer's files, once Materialize wrote them
	// (local.go): reads come from there.
	files atomic.Pointer[string]
	// storeMu orders chunk stores (read-locked) before the chunk cache is
	// dropped (locked).
	storeMu sync.RWMutex

	// Open files (handle.go): cachedOpens counts, per file, the opens in
	// the kernel's cached mode, which keep passthrough off that file.
	opensMu       sync.Mutex
	cachedOpens   map[*estargz.TOCEntry]int
	noPassthrough atomic.Bool
	servedReads   atomic.Int64
	// held: the layer is served through fuseconn (Tree), which registers
	// its backing files (handle.go).
	held atomic.Bool
}

// UseLocal serves every chunk not yet cached from f, the layer's whole
// blob verified on disk (its digest and diff ID), instead of the source.
// Chunks are still checked against their TOC digests. The layer closes
// f in Close.
func (l *Layer) UseLocal(f *os.File) {
	if old := l.local.Swap(f); old != nil {
		old.Close()
	}
}

// Local reports whether the layer reads from its local blob.
func (l *Layer) Local() bool { return l.local.Load() != nil }

// Close releases the local blob, if any.
func (l *Layer) Close() {
	if f := l.local.Swap(nil); f != nil {
		f.Close()
	}
}

type chunkCall struct {
	done chan struct{}
	data []byte
	err  error
}

// Open fetches the footer and TOC of src's blob (two range requests),
// checks the TOC against tocDigest (the manifest's annotation) and that
// every chunk has a digest.
func Open(ctx context.Context, src Source, tocDigest string, opts Options) (*Layer, error) {
	want, err := digest.Parse(tocDigest)
	if err != nil {
		return nil, fmt.Errorf("TOC digest %q: %w", tocDigest, err)
	}
	if opts.CacheDir == "" {
		return nil, errors.New("lazy layer: no cache directory")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = 100 * time.Millisecond
	}
	l := &Layer{src: src, opts: opts, log: opts.Log, inflight: map[string]*chunkCall{}}
	size := src.Size()
	if size < estargz.FooterSize {
		return nil, fmt.Errorf("blob of %d bytes is smaller than an eStargz footer", size)
	}
	footer, err := l.readRange(ctx, size-estargz.FooterSize, size)
	if err != nil {
		return nil, fmt.Errorf("read eStargz footer: %w", err)
	}
	_, tocOffset, _, err := new(estargz.GzipDecompressor).ParseFooter(footer)
	if err != nil {
		return nil, fmt.Errorf("eStargz footer: %w", err)
	}
	if tocOffset < 0 || tocOffset > size-estargz.FooterSize {
		return nil, fmt.Errorf("eStargz footer names TOC offset %d in a blob of %d bytes", tocOffset, size)
	}
	if n := size - tocOffset; n > maxTOCCompressed {
		return nil, fmt.Errorf("eStargz TOC of %d bytes, over the limit of %d", n, maxTOCCompressed)
	}
	tail, err := l.readRange(ctx, tocOffset, size)
	if err != nil {
		return nil, fmt.Errorf("read eStargz TOC: %w", err)
	}
	if err := checkTOCSize(tail); err != nil {
		return nil, err
	}
	// The reader sees the blob through the tail just read; anything else
	// it asked for would be a range request without a context, and it
	// asks for nothing else (its file reads are not used: chunk does them,
	// verified).
	sr := io.NewSectionReader(&tailReaderAt{off: tocOffset, tail: tail}, 0, size)
	r, err := estargz.Open(sr, estargz.WithTOCOffset(tocOffset))
	if err != nil {
		return nil, fmt.Errorf("open eStargz TOC: %w", err)
	}
	if l.verify, err = r.VerifyTOC(want); err != nil {
		return nil, fmt.Errorf("verify eStargz TOC: %w", err)
	}
	l.r, l.tocTail = r, tail
	if err := os.MkdirAll(opts.CacheDir, 0o700); err != nil {
		return nil, err
	}
	// A Materialize cut short (kill -9) left its temp dir: redone later.
	if err := removeTempFiles(opts.CacheDir); err != nil {
		return nil, fmt.Errorf("lazy layer: remove a partial files dir: %w", err)
	}
	return l, nil
}

// TOCTail is the blob's tail from its TOC's offset (the TOC and the
// footer) that Open fetched and verified: what a server that serves the
// layer from disk reads instead of asking for it again (decision 3600,
// S4). The caller must not change it.
func (l *Layer) TOCTail() []byte { return l.tocTail }

// checkTOCSize refuses a TOC whose JSON is over MaxTOCJSON, from its tar
// header, before the format's parser reads it whole.
func checkTOCSize(tail []byte) error {
	zr, err := gzip.NewReader(bytes.NewReader(tail))
	if err != nil {
		return fmt.Errorf("eStargz TOC: %w", err)
	}
	zr.Multistream(false)
	h, err := tar.NewReader(zr).Next()
	if err != nil {
		return fmt.Errorf("eStargz TOC: %w", err)
	}
	if h.Name != estargz.TOCTarName {
		return fmt.Errorf("eStargz TOC entry is %q, not %q", h.Name, estargz.TOCTarName)
	}
	if h.Size > MaxTOCJSON {
		return fmt.Errorf("eStargz TOC of %d bytes of JSON, over the limit of %d", h.Size, MaxTOCJSON)
	}
	return nil
}

// tailReaderAt is the blob's tail from off, in memory.
type tailReaderAt struct {
	off  int64
	tail []byte
}

func (t *tailReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < t.off || off-t.off >= int64(len(t.tail)) {
		return 0, fmt.Errorf("eStargz: read at %d outside the fetched TOC", off)
	}
	n := copy(p, t.tail[off-t.off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Lookup is the TOC entry of path ("" the root).
func (l *Layer) Lookup(path string) (*estargz.TOCEntry, bool) { return l.r.Lookup(path) }

// Corrupt reports whether a chunk of the layer failed its digest.
func (l *Layer) Corrupt() bool { return l.corrupt.Load() }

// CachedBytes is how many bytes of verified chunks the layer keeps on
// disk.
func (l *Layer) CachedBytes() int64 { return l.cached.Load() }

// FetchedBytes is how many bytes the layer fetched from its source.
func (l *Layer) FetchedBytes() int64 { return l.fetched.Load() }

// ReadFile reads the regular file ent into p from off, chunk by verified
// chunk, reading of each chunk only the bytes asked for. It returns fewer
// bytes only at the end of the file.
func (l *Layer) ReadFile(ctx context.Context, ent *estargz.TOCEntry, p []byte, off int64) (int, error) {
	if off >= ent.Size {
		return 0, nil
	}
	end := min(off+int64(len(p)), ent.Size)
	if n, ok := l.readLocalFile(ent, p[:end-off], off); ok {
		return n, nil
	}
	n := 0
	for pos := off; pos < end; {
		ce, ok := l.r.ChunkEntryForOffset(ent.Name, pos)
		if !ok {
			return n, fmt.Errorf("%s: no chunk at offset %d in the TOC", ent.Name, pos)
		}
		in := pos - ce.ChunkOffset
		if in < 0 || in >= ce.ChunkSize {
			return n, fmt.Errorf("%s: chunk at %d does not hold offset %d", ent.Name, ce.ChunkOffset, pos)
		}
		c, err := l.readChunk(ctx, ce, p[pos-off:end-off], in)
		if err != nil {
			return n, err
		}
		n += c
		pos += int64(c)
	}
	return n, nil
}

// readChunk reads into dst the bytes of chunk ce from in (as many as dst
// holds, to the chunk's end), verified: from the chunk's file in the
// cache, only the bytes asked for, or fetched (one fetch per chunk
// however many readers wait).
func (l *Layer) readChunk(ctx context.Context, ce *estargz.TOCEntry, dst []byte, in int64) (int, error) {
	cached, err := l.cachePath(ce)
	if err != nil {
		return 0, err
	}
	dst = dst[:min(int64(len(dst)), ce.ChunkSize-in)]
	if n, ok := readCached(cached, ce.ChunkSize, dst, in); ok {
		return n, nil
	}
	data, err := l.chunk(ctx, ce, cached)
	if err != nil {
		return 0, err
	}
	if int64(len(data)) != ce.ChunkSize {
		return 0, fmt.Errorf("%s: chunk at %d: %d bytes, the TOC says %d", ce.Name, ce.ChunkOffset, len(data), ce.ChunkSize)
	}
	return copy(dst, data[in:]), nil
}

// cachePath is where chunk ce is cached: named by its digest.
func (l *Layer) cachePath(ce *estargz.TOCEntry) (string, error) {
	d, err := digest.Parse(ce.ChunkDigest)
	if err != nil {
		return "", fmt.Errorf("%s: chunk at %d: digest %q: %w", ce.Name, ce.ChunkOffset, ce.ChunkDigest, err)
	}
	return filepath.Join(l.opts.CacheDir, d.Encoded()), nil
}

// readCached reads dst from off of the chunk file at path, if the cache
// holds it whole. Only verified chunks are written there, whole, under a
// temporary name then renamed (store), and the directory is berthd's own:
// a file of the chunk's size is the chunk.
func readCached(path string, size int64, dst []byte, off int64) (int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Size() != size {
		return 0, false
	}
	n, err := f.ReadAt(dst, off)
	if n < len(dst) {
		return 0, false
	}
	_ = err // io.EOF at the chunk's end, with every byte asked for
	return n, true
}

// chunk is the uncompressed, verified data of chunk entry ce, fetched
// and then cached at cached: one fetch per chunk however many readers
// wait. The call stays in inflight, with its data, until the chunk is in
// the cache, so that a reader that missed the cache meanwhile finds one
// or the other.
func (l *Layer) chunk(ctx context.Context, ce *estargz.TOCEntry, cached string) ([]byte, error) {
	l.mu.Lock()
	c, ok := l.inflight[ce.ChunkDigest]
	if !ok {
		// Stored and out of inflight since this reader missed the cache?
		if st, err := os.Stat(cached); err == nil && st.Size() == ce.ChunkSize {
			l.mu.Unlock()
			data, err := os.ReadFile(cached)
			if err == nil && int64(len(data)) == ce.ChunkSize {
				return data, nil
			}
			l.mu.Lock()
			c, ok = l.inflight[ce.ChunkDigest]
		}
	}
	if ok {
		l.mu.Unlock()
		select {
		case <-c.done:
			return c.data, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c = &chunkCall{done: make(chan struct{})}
	l.inflight[ce.ChunkDigest] = c
	l.mu.Unlock()
	// The fetch is shared: it runs to its end even when the reader that
	// started it gives up, bounded by the retries.
	c.data, c.err = l.fetchChunk(context.WithoutCancel(ctx), ce)
	close(c.done)
	if c.err == nil {
		l.store(cached, c.data)
	}
	l.mu.Lock()
	delete(l.inflight, ce.ChunkDigest)
	l.mu.Unlock()
	return c.data, c.err
}

// fetchChunk fetches ce's compressed bytes (from the source, or the local
// blob once there is one), decompresses and verifies them.
func (l *Layer) fetchChunk(ctx context.Context, ce *estargz.TOCEntry) ([]byte, error) {
	start, end := ce.Offset, ce.NextOffset()
	if ce.ChunkSize <= 0 || ce.ChunkSize > maxChunk || end <= start || end-start > maxChunkOnTheWire || end > l.src.Size() {
		return nil, l.fail(fmt.Errorf("%s: chunk at %d: %d bytes at [%d, %d) of the blob: %w", ce.Name, ce.ChunkOffset, ce.ChunkSize, start, end, ErrCorrupt))
	}
	raw, err := l.readRange(ctx, start, end)
	if err != nil {
		return nil, fmt.Errorf("%s: fetch chunk at %d: %w", ce.Name, ce.ChunkOffset, err)
	}
	return l.decode(ce, raw)
}

// decode decompresses one chunk from raw (the blob from ce.Offset) and
// checks it against its digest.
func (l *Layer) decode(ce *estargz.TOCEntry, raw []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, l.fail(fmt.Errorf("%s: chunk at %d: %w: %w", ce.Name, ce.ChunkOffset, ErrCorrupt, err))
	}
	if _, err := io.CopyN(io.Discard, zr, ce.InnerOffset); err != nil {
		return nil, l.fail(fmt.Errorf("%s: chunk at %d: %w: %w", ce.Name, ce.ChunkOffset, ErrCorrupt, err))
	}
	data := make([]byte, ce.ChunkSize)
	if _, err := io.ReadFull(zr, data); err != nil {
		return nil, l.fail(fmt.Errorf("%s: chunk at %d: %w: %w", ce.Name, ce.ChunkOffset, ErrCorrupt, err))
	}
	v, err := l.verify.Verifier(ce)
	if err != nil {
		return nil, l.fail(fmt.Errorf("%s: chunk at %d: %w: %w", ce.Name, ce.ChunkOffset, ErrCorrupt, err))
	}
	v.Write(data)
	if !v.Verified() {
		return nil, l.fail(fmt.Errorf("%s: chunk at %d: %w", ce.Name, ce.ChunkOffset, ErrCorrupt))
	}
	return data, nil
}

// MarkCorrupt records that the layer's blob is not what its image says
// (its diff ID or digest did not match when fetched whole).
func (l *Layer) MarkCorrupt(err error) { _ = l.fail(err) }

// fail records a corrupt layer (the first time, telling OnCorrupt).
func (l *Layer) fail(err error) error {
	if l.corrupt.CompareAndSwap(false, true) {
		l.log.Error("lazy layer: corrupt chunk", "error", err)
		if l.opts.OnCorrupt != nil {
			l.opts.OnCorrupt(err)
		}
	}
	return err
}

// store writes a verified chunk to the cache; failing to is only slower.
// A layer whose files are local keeps no chunks.
func (l *Layer) store(cached string, data []byte) {
	// Held across the write, so that useFiles, which drops the cache,
	// waits for a store under way and every later one sees the files.
	l.storeMu.RLock()
	defer l.storeMu.RUnlock()
	if l.LocalFiles() {
		return
	}
	tmp := cached + ".tmp-" + fmt.Sprint(time.Now().UnixNano())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		l.log.Warn("lazy layer: cache chunk", "error", err)
		os.Remove(tmp)
		return
	}
	if err := os.Rename(tmp, cached); err != nil {
		os.Remove(tmp)
		return
	}
	l.cached.Add(int64(len(data)))
}

// readRange reads the blob's bytes [start, end), retrying a failed
// request with back-off.
func (l *Layer) readRange(ctx context.Context, start, end int64) ([]byte, error) {
	delay := l.opts.RetryDelay
	var last error
	for attempt := 0; attempt <= l.opts.Retries; attempt++ {
		if attempt > 0 {
			l.log.Warn("lazy layer: range request failed, retrying", "start", start, "end", end, "attempt", attempt, "error", last)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			delay *= 2
		}
		buf, err := l.readRangeOnce(ctx, start, end)
		if err == nil {
			return buf, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, ErrNoRanges) || errors.Is(err, ErrGivenUp) {
			return nil, err
		}
		last = err
	}
	return nil, last
}

func (l *Layer) readRangeOnce(ctx context.Context, start, end int64) ([]byte, error) {
	if f := l.local.Load(); f != nil {
		buf := make([]byte, end-start)
		if _, err := f.ReadAt(buf, start); err != nil {
			return nil, fmt.Errorf("local blob bytes %d-%d: %w", start, end-1, err)
		}
		return buf, nil
	}
	if l.opts.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.opts.RequestTimeout)
		defer cancel()
	}
	rc, err := l.src.OpenRange(ctx, start, end)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	buf := make([]byte, end-start)
	_, err = io.ReadFull(&countingReader{r: rc, counts: []*atomic.Int64{&l.fetched, l.opts.Progress}}, buf)
	if err != nil {
		return nil, fmt.Errorf("bytes %d-%d: %w", start, end-1, err)
	}
	return buf, nil
}

// Prefetch fetches and caches the chunks of the files before the
// prefetch landmark (what the image says is read first at start), in one
// range request. A layer without a landmark prefetches nothing.
func (l *Layer) Prefetch(ctx context.Context) error {
	lm, ok := l.r.Lookup(estargz.PrefetchLandmark)
	if !ok {
		return nil
	}
	var chunks []*estargz.TOCEntry
	seen := map[*estargz.TOCEntry]bool{}
	l.walk(func(ent *estargz.TOCEntry) {
		if ent.Type != "reg" || seen[ent] || ent.Size == 0 {
			return
		}
		seen[ent] = true
		for off := int64(0); off < ent.Size; {
			ce, ok := l.r.ChunkEntryForOffset(ent.Name, off)
			if !ok || ce.ChunkSize <= 0 {
				return
			}
			if ce.Offset < lm.Offset {
				chunks = append(chunks, ce)
			}
			off = ce.ChunkOffset + ce.ChunkSize
		}
	})
	if len(chunks) == 0 {
		return nil
	}
	sort.Slice(chunks, func(i, j int) bool { return chunks[i].Offset < chunks[j].Offset })
	first, last := chunks[0].Offset, chunks[0].NextOffset()
	for _, ce := range chunks {
		last = max(last, ce.NextOffset())
	}
	// One request for the whole prioritized region; chunks are decoded
	// from it in order.
	raw, err := l.readRange(ctx, first, last)
	if err != nil {
		return fmt.Errorf("prefetch: %w", err)
	}
	for _, ce := range chunks {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := ce.NextOffset()
		if ce.Offset < first || end > last || end <= ce.Offset {
			return l.fail(fmt.Errorf("prefetch %s: chunk at [%d, %d) outside the region: %w", ce.Name, ce.Offset, end, ErrCorrupt))
		}
		d, err := digest.Parse(ce.ChunkDigest)
		if err != nil {
			return l.fail(fmt.Errorf("prefetch %s: %w: %w", ce.Name, ErrCorrupt, err))
		}
		data, err := l.decode(ce, raw[ce.Offset-first:end-first])
		if err != nil {
			return fmt.Errorf("prefetch: %w", err)
		}
		l.store(filepath.Join(l.opts.CacheDir, d.Encoded()), data)
	}
	return nil
}

// walk calls fn for every entry under the root, parents first.
func (l *Layer) walk(fn func(*estargz.TOCEntry)) {
	root, ok := l.r.Lookup("")
	if !ok {
		return
	}
	var rec func(*estargz.TOCEntry)
	rec = func(dir *estargz.TOCEntry) {
		dir.ForeachChild(func(_ string, ent *estargz.TOCEntry) bool {
			fn(ent)
			if ent.Type == "dir" {
				rec(ent)
			}
			return true
		})
	}
	rec(root)
}

// isLandmark names the format's own files, which the filesystem hides.
func isLandmark(name string) bool {
	switch strings.TrimPrefix(name, "/") {
	case estargz.PrefetchLandmark, estargz.NoPrefetchLandmark, estargz.TOCTarName:
		return true
	}
	return false
}

// countingReader adds what it reads to each of counts (nil ones skipped).
type countingReader struct {
	r      io.Reader
	counts []*atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for _, ct := range c.counts {
		if ct != nil {
			ct.Add(int64(n))
		}
	}
	return n, err
}
