package image

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
)

// blobFetch is one layer blob on its way into the content store: the one
// place a layer's compressed bytes come from the registry (or an
// archive), are counted for the pull's progress and the metrics, and are
// verified (size and digest) before the blob is committed. Its reader
// hands the blob's bytes, in order, to whoever consumes them (the
// unpacker) as they arrive; finish reads what the consumer left, checks
// and commits. A blob already stored is read from disk instead, and
// neither written nor counted as downloaded.
//
// A large blob from a registry that serves ranges comes in parallel range
// requests (rangefetch.go, decision 3000): they write into the ingest file
// at their offsets, and r reads the contiguous prefix written so far, so
// that the unpacker and the digest still see the blob once, in order.
//
// A blobFetch is used by one goroutine.
type blobFetch struct {
	lr       layerMeta
	src      io.ReadCloser // nil when ranged
	ranged   *rangeFetch   // the blob in parallel ranges, or nil
	in       *ingest       // nil when the blob was already stored
	have     int64         // bytes of a partial blob resumed, read from disk
	r        io.Reader
	count    *atomic.Int64 // bytes read from src (the pull's progress)
	observer PullObserver
	faults   *fault.Injector
}

// startBlobFetch opens lr's blob, from the content store when it is there
// and through open otherwise; count hears about every byte read. A large
// blob from a registry that serves ranges is fetched in parallel ranges
// (rangefetch.go).
func (s *Store) startBlobFetch(ctx context.Context, lr layerMeta, open blobOpener, count *atomic.Int64) (*blobFetch, error) {
	f := &blobFetch{lr: lr, count: count, observer: s.observer, faults: s.faults}
	if s.content.has(lr.Digest) {
		src, err := s.content.open(lr.Digest)
		if err != nil {
			return nil, fmt.Errorf("fetch layer %s: %w", lr.Digest, err)
		}
		f.src = src
		f.r = &progressReader{ctx: ctx, r: src, n: count}
		return f, nil
	}
	var err error
	if f.in, err = s.content.newIngest(lr.Digest); err != nil {
		return nil, err
	}
	if ro, ok := open.(rangeOpener); ok && ro.ranges().applies(lr.Size) {
		err = f.startRanges(ctx, ro, s.log)
	} else {
		f.src, err = open.open(ctx, lr)
	}
	if err != nil {
		f.in.abort()
		return nil, fmt.Errorf("fetch layer %s: %w", lr.Digest, classify(err))
	}
	if f.ranged != nil {
		// The workers wrote the file; its reader hashes it in order.
		f.r = io.TeeReader(f.ranged, f.in.hashing())
		return f, nil
	}
	// One byte over the announced size is enough to refuse the blob.
	f.r = io.TeeReader(io.LimitReader(&progressReader{ctx: ctx, r: f.src, n: count}, lr.Size+1), f.in)
	return f, nil
}

// startResumableFetch is startBlobFetch for a lazy layer's background
// fetch (decision 3600): the blob is written to partial, a file in the
// layer's dir (which outlives berthd, where ingest/ is emptied at
// start), and a fetch that finds bytes there asks the registry only for
// the rest: in ranges when the blob is large (the prefix written is
// recorded beside it, in partial.prefix), else in one stream. The bytes
// on disk are read back first, so that the digest and the diff ID cover
// the whole blob; a partial blob that is not the blob's start fails
// them, and the caller discards it (fetchWholeBlob).
func (s *Store) startResumableFetch(ctx context.Context, lr layerMeta, open blobOpener, count *atomic.Int64, partial string) (*blobFetch, error) {
	prefixPath := partial + ".prefix"
	if s.content.has(lr.Digest) {
		os.Remove(partial)
		os.Remove(prefixPath)
		return s.startBlobFetch(ctx, lr, open, count)
	}
	in, have, err := s.content.resumeIngest(lr.Digest, partial, prefixPath, lr.Size)
	if err != nil {
		return nil, err
	}
	f := &blobFetch{lr: lr, in: in, count: count, observer: s.observer, faults: s.faults}
	ro, ranged := open.(rangeOpener)
	switch {
	case have < lr.Size && ranged && ro.ranges().applies(lr.Size):
		if err = in.recordPrefix(have); err == nil {
			err = f.startRangesAt(ctx, ro, have, in.recordPrefix, s.log)
		}
		if err == nil && f.src != nil {
			// The registry ignores ranges: the whole blob again.
			have, err = 0, in.restartAt(0)
		}
	case have == lr.Size:
		f.src = io.NopCloser(strings.NewReader(""))
		err = in.restartAt(have)
	case have > 0 && ranged:
		if err = in.restartAt(have); err == nil {
			var partial bool
			f.src, partial, err = ro.openRange(ctx, lr, have, lr.Size)
			if err == nil && !partial {
				// The registry ignores ranges: the whole blob again.
				have, err = 0, in.restartAt(0)
			}
		}
	default:
		have, err = 0, in.restartAt(0)
		if err == nil {
			f.src, err = open.open(ctx, lr)
		}
	}
	if err != nil {
		f.close()
		return nil, fmt.Errorf("fetch layer %s: %w", lr.Digest, classify(err))
	}
	if have > 0 {
		s.log.Info("lazy layer: background fetch resumes after the bytes already on disk", "layer", lr.ChainID, "blob", lr.Digest, "bytes", have)
	}
	f.have = have
	if f.ranged != nil {
		// It reads the bytes on disk back first, then what comes.
		f.r = io.TeeReader(f.ranged, in.hashing())
		return f, nil
	}
	onDisk := io.TeeReader(io.NewSectionReader(in.f, 0, have), in.hashing())
	rest := io.TeeReader(io.LimitReader(&progressReader{ctx: ctx, r: f.src, n: count}, lr.Size-have+1), in)
	f.r = io.MultiReader(onDisk, rest)
	return f, nil
}

// startRanges asks for the blob's first chunk: a 206 starts the ranged
// fetch, a 200 (the registry ignores Range) is the one stream, f.src.
func (f *blobFetch) startRanges(ctx context.Context, ro rangeOpener, log *slog.Logger) error {
	return f.startRangesAt(ctx, ro, 0, nil, log)
}

// startRangesAt is startRanges for a blob whose first have bytes are in
// the ingest file already; record is told the prefix written.
func (f *blobFetch) startRangesAt(ctx context.Context, ro rangeOpener, have int64, record func(int64) error, log *slog.Logger) error {
	set := ro.ranges()
	chunkEnd := min((have/set.ChunkSize+1)*set.ChunkSize, f.lr.Size)
	body, partial, err := ro.openRange(ctx, f.lr, have, chunkEnd)
	if err != nil {
		return err
	}
	if !partial {
		log.Debug("registry ignores range requests, fetching the layer as one stream", "layer", f.lr.Digest)
		f.src = body
		return nil
	}
	f.ranged, err = startRangeFetch(ctx, ro, f.lr, set, f.in.f, body, have, record, f.count, log)
	return err
}

func (f *blobFetch) Read(p []byte) (int, error) { return f.r.Read(p) }

// finish ends the fetch after its consumer returned err: it reads what the
// consumer left (the whole blob when it needed none of it), reports the
// downloaded bytes, and commits the blob if it had its announced size and
// digest. Any error leaves the blob out of the store (close removes it).
func (f *blobFetch) finish(err error) error {
	if err == nil {
		// What the decompressor left unread still counts for the digest.
		if _, err = io.Copy(io.Discard, f.r); err != nil {
			err = fmt.Errorf("layer %s: read: %w", f.lr.Digest, err)
		}
	}
	if f.in == nil {
		return err
	}
	n := f.count.Load()
	if f.observer != nil {
		f.observer.PulledBytes(n)
	}
	// A blob longer than announced is the clearer error when the stream
	// broke for it.
	if f.have+n > f.lr.Size {
		return fmt.Errorf("layer %s: received more than the %d bytes the manifest says: %w", f.lr.Digest, f.lr.Size, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return err
	}
	return f.in.commit("layer", f.lr.Size, func(got string) string {
		if err := f.faults.Fail(fault.ImageFailLayerDigest); err != nil {
			return "sha256:" + strings.Repeat("0", 64) + " (" + err.Error() + ")"
		}
		return got
	})
}

// close releases the source and removes an uncommitted blob.
func (f *blobFetch) close() {
	if f.ranged != nil {
		f.ranged.close()
	}
	if f.src != nil {
		f.src.Close()
	}
	if f.in != nil {
		f.in.abort()
		if f.in.gone && f.in.prefixPath != "" {
			// A range worker may have recorded a prefix after the
			// commit or the discard; stopped now.
			os.Remove(f.in.prefixPath)
		}
	}
}
