package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

// Parallel range requests within one large layer blob (decision 3000). A layer of at least RangeFetch.MinSize, from a registry that
// answers a Range request with 206 and a matching Content-Range, is
// fetched as chunks of ChunkSize by Parallel workers, each writing its
// chunk into the ingest file at its offset. The blob's reader follows the
// contiguous prefix written so far, so the digest and the unpacker still
// see the blob once and in order while later chunks are in flight; memory
// is one copy buffer per worker, the blob itself is on disk (where it is
// stored anyway). A chunk whose connection breaks is asked for again from
// its last byte, at most Retries times.

// RangeFetch configures parallel range requests within one layer blob.
// The zero value (or Parallel < 1) fetches every blob as one stream.
type RangeFetch struct {
	// MinSize is the smallest layer blob fetched in ranges.
	MinSize int64
	// ChunkSize is the size of one range request.
	ChunkSize int64
	// Parallel is how many ranges of one blob are in flight at once.
	Parallel int
	// Retries is how often one chunk is asked for again after its
	// connection broke (each time from its last byte received).
	Retries int
}

// DefaultRangeFetch is what berthd uses when its configuration says
// nothing else.
var DefaultRangeFetch = RangeFetch{MinSize: 64 << 20, ChunkSize: 32 << 20, Parallel: 4, Retries: 5}

func (r RangeFetch) applies(size int64) bool {
	return r.Parallel >= 1 && r.ChunkSize > 0 && r.MinSize > 0 && size >= r.MinSize && size > r.ChunkSize
}

// rangeCopyBuf is each range worker's copy buffer.
const rangeCopyBuf = 1 << 20

// rangeFetch is one blob being fetched in ranges into an ingest file.
// Workers write chunks at their offsets and report what they wrote; the
// reader (Read) waits for the contiguous prefix to pass its position.
type rangeFetch struct {
	ctx    context.Context
	cancel context.CancelFunc
	open   rangeOpener
	lr     layerMeta
	set    RangeFetch
	out    *os.File // the ingest file, written at offsets and read back in order
	count  *atomic.Int64
	log    *slog.Logger

	next atomic.Int64 // the next chunk a worker takes
	wg   sync.WaitGroup

	mu      sync.Mutex // guards written, prefix, err
	written []int64    // bytes written of each chunk, from its start
	prefix  int64      // bytes [0, prefix) are written
	err     error      // the first worker's failure
	notify  chan struct{}

	pos int64 // the reader's position

	// record, if set, is told the prefix written at each chunk's end
	// (a lazy layer's partial blob, resumed from there); recorded is
	// the last prefix told, under recMu.
	record   func(int64) error
	recMu    sync.Mutex
	recorded int64
}

// startRangeFetch fetches lr's blob into out in ranges; first is the
// response to the request of the blob from byte have to its chunk's end
// (the probe), already a 206. The bytes before have are in out already
// (a partial blob resumed): read back, not fetched. record, if set, is
// told the prefix written as it passes each chunk's end.
func startRangeFetch(ctx context.Context, open rangeOpener, lr layerMeta, set RangeFetch, out *os.File, first io.ReadCloser, have int64, record func(int64) error, count *atomic.Int64, log *slog.Logger) (*rangeFetch, error) {
	// Reserve the blob's space at once (fewer extents for a multi-GB
	// file); a filesystem without fallocate gets a sparse file.
	if err := unix.Fallocate(int(out.Fd()), 0, 0, lr.Size); err != nil {
		if err := out.Truncate(lr.Size); err != nil {
			first.Close()
			return nil, fmt.Errorf("layer %s: size ingest: %w", lr.Digest, err)
		}
	}
	chunks := (lr.Size + set.ChunkSize - 1) / set.ChunkSize
	ctx, cancel := context.WithCancel(ctx)
	f := &rangeFetch{
		ctx: ctx, cancel: cancel, open: open, lr: lr, set: set, out: out,
		count: count, log: log, written: make([]int64, chunks), notify: make(chan struct{}, 1),
		record: record, recorded: have, prefix: have,
	}
	firstChunk := have / set.ChunkSize
	for c := range firstChunk {
		start, end := f.bounds(c)
		f.written[c] = end - start
	}
	f.written[firstChunk] = have - firstChunk*set.ChunkSize
	f.next.Store(firstChunk + 1)
	workers := min(int64(set.Parallel), chunks-firstChunk)
	f.wg.Add(int(workers))
	go func() {
		defer f.wg.Done()
		f.fail(f.fetchChunk(firstChunk, first))
		f.work()
	}()
	for i := int64(1); i < workers; i++ {
		go func() {
			defer f.wg.Done()
			f.work()
		}()
	}
	return f, nil
}

// work fetches chunks in order until none is left or the fetch failed.
func (f *rangeFetch) work() {
	for f.ctx.Err() == nil {
		i := f.next.Add(1) - 1
		if i >= int64(len(f.written)) {
			return
		}
		f.fail(f.fetchChunk(i, nil))
	}
}

func (f *rangeFetch) bounds(i int64) (start, end int64) {
	start = i * f.set.ChunkSize
	return start, min(start+f.set.ChunkSize, f.lr.Size)
}

// fetchChunk brings chunk i into the file: from body when it is the open
// response for the chunk's start, else from a request of its own. A
// broken connection is retried from the chunk's last byte written.
func (f *rangeFetch) fetchChunk(i int64, body io.ReadCloser) error {
	start, end := f.bounds(i)
	buf := make([]byte, rangeCopyBuf)
	var lastErr error
	for attempt := 0; attempt <= f.set.Retries; attempt++ {
		if attempt > 0 && !f.backoff(attempt) {
			return f.ctx.Err()
		}
		off := start + f.chunkWritten(i)
		if off == end {
			return nil
		}
		if body == nil {
			var partial bool
			var err error
			body, partial, err = f.open.openRange(f.ctx, f.lr, off, end)
			if err != nil {
				if f.ctx.Err() != nil {
					return f.ctx.Err()
				}
				if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrUnauthenticated) {
					return fmt.Errorf("layer %s: range %d-%d: %w", f.lr.Digest, off, end-1, err)
				}
				lastErr = err
				f.log.Warn("layer range request failed", "layer", f.lr.Digest, "offset", off, "attempt", attempt+1, "error", err)
				continue
			}
			if !partial {
				body.Close()
				return fmt.Errorf("layer %s: the registry answered the range %d-%d with the whole blob: %w", f.lr.Digest, off, end-1, errdefs.ErrInvalidArgument)
			}
		}
		err := f.copyRange(i, body, off, end, buf)
		body.Close()
		body = nil
		if err == nil {
			return nil
		}
		if f.ctx.Err() != nil {
			return f.ctx.Err()
		}
		lastErr = err
		f.log.Warn("layer range broke, resuming", "layer", f.lr.Digest, "offset", start+f.chunkWritten(i), "attempt", attempt+1, "error", err)
	}
	return fmt.Errorf("layer %s: range %d-%d: %d attempts failed: %w", f.lr.Digest, start, end-1, f.set.Retries+1, lastErr)
}

// backoff waits a little longer before each retry (100 ms × attempt);
// false when the fetch ended meanwhile.
func (f *rangeFetch) backoff(attempt int) bool {
	t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-f.ctx.Done():
		return false
	}
}

// copyRange writes body, the bytes [off, end) of the blob, into the file
// at off, reporting each write.
func (f *rangeFetch) copyRange(i int64, body io.Reader, off, end int64, buf []byte) error {
	for off < end {
		n, err := io.ReadFull(body, buf[:min(int64(len(buf)), end-off)])
		if n > 0 {
			if _, werr := f.out.WriteAt(buf[:n], off); werr != nil {
				return fmt.Errorf("write ingest: %w", werr)
			}
			off += int64(n)
			f.count.Add(int64(n))
			f.wrote(i, int64(n))
		}
		if err != nil {
			if off < end {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
	}
	return nil
}

func (f *rangeFetch) chunkWritten(i int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.written[i]
}

// wrote records n more bytes of chunk i and moves the prefix on.
func (f *rangeFetch) wrote(i, n int64) {
	f.mu.Lock()
	f.written[i] += n
	for {
		c := f.prefix / f.set.ChunkSize
		if c >= int64(len(f.written)) {
			break
		}
		start, end := f.bounds(c)
		p := start + f.written[c]
		if p == f.prefix {
			break
		}
		f.prefix = p
		if p < end {
			break
		}
	}
	prefix := f.prefix
	f.mu.Unlock()
	f.wake()
	if f.record != nil && (prefix == f.lr.Size || prefix%f.set.ChunkSize == 0) {
		f.recordPrefix(prefix)
	}
}

// recordPrefix tells record the prefix written, once for each and only
// forward (workers may come in any order). A failure costs the bytes
// after the last prefix recorded at the next try, nothing else.
func (f *rangeFetch) recordPrefix(prefix int64) {
	f.recMu.Lock()
	defer f.recMu.Unlock()
	if prefix <= f.recorded {
		return
	}
	if err := f.record(prefix); err != nil {
		f.log.Warn("layer range fetch: record what is written", "layer", f.lr.Digest, "error", err)
		return
	}
	f.recorded = prefix
}

// fail records a worker's failure (the first one wins) and stops the
// others.
func (f *rangeFetch) fail(err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	f.cancel()
	f.wake()
}

func (f *rangeFetch) wake() {
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

// Read returns the blob's next bytes once they are written.
func (f *rangeFetch) Read(p []byte) (int, error) {
	if f.pos >= f.lr.Size {
		return 0, io.EOF
	}
	for {
		f.mu.Lock()
		prefix, err := f.prefix, f.err
		f.mu.Unlock()
		if prefix > f.pos {
			n, rerr := f.out.ReadAt(p[:min(int64(len(p)), prefix-f.pos)], f.pos)
			f.pos += int64(n)
			if rerr != nil && !errors.Is(rerr, io.EOF) {
				return n, fmt.Errorf("read back ingest: %w", rerr)
			}
			return n, nil
		}
		if err != nil {
			return 0, err
		}
		select {
		case <-f.notify:
		case <-f.ctx.Done():
			// A worker's failure is the better answer; the next
			// round returns it (or the context's error).
			f.mu.Lock()
			if f.err == nil {
				f.err = context.Cause(f.ctx)
			}
			f.mu.Unlock()
		}
	}
}

// close stops the workers and waits for them: after close nothing writes
// the file.
func (f *rangeFetch) close() {
	f.cancel()
	f.wg.Wait()
}
