package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/gzip"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
)

// Background fetch (stage S3): the whole blob of a lazy layer comes in
// behind the containers' reads, through the same fetch as a full pull
// (blobFetch: ranged for large blobs, its digest and size checked), its
// decompressed stream checked against the config's diff ID; then berthd
// writes complete.json into the layer dir, and the server (berth-lazy)
// reads every chunk from the blob, writes the layer's files out and drops
// its chunk cache (decision 3600, S4): the node ends with the whole image
// as after a full pull. A registry that fails or stalls
// (image_pull_progress_timeout without a byte) is tried again with
// back-off, from 1 s doubling to a minute, until the fetch completes or
// the layer goes.

const (
	backgroundRetryFirst = time.Second
	backgroundRetryMax   = time.Minute
	// corruptPoll is how often berthd looks for the server's corrupt
	// mark in a lazy layer's dir.
	corruptPoll = time.Second
)

func (s *Store) backgroundFetch(ctx context.Context, lr layerMeta, rb registryBlobs, e *lazyEntry) {
	if c, err := lazysrv.LoadComplete(e.dir); err == nil && c != nil {
		return
	}
	if !s.lazy.waitQuiet(ctx, rb.lazyQuiet, backgroundQuietMax) {
		return
	}
	delay := backgroundRetryFirst
	for {
		unpacked, err := s.fetchWholeBlob(ctx, lr, rb, rb.lazyTimeout, filepath.Join(e.dir, PartialBlobFile))
		if err == nil {
			err = s.writeComplete(lr, e, unpacked)
			if err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errCorruptBlob) {
			// The registry's bytes are not the image's: not kept.
			s.markCorrupt(lr.ChainID, e, err)
			return
		}
		s.log.Warn("lazy layer: background fetch failed, retrying", "layer", lr.ChainID, "in", delay, "error", err)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		delay = min(2*delay, backgroundRetryMax)
	}
}

// writeComplete tells the layer's server that the blob is in the store,
// verified, with its unpacked size (the files the TOC lists may not add
// up to more, as a full pull's could not).
func (s *Store) writeComplete(lr layerMeta, e *lazyEntry, unpacked int64) error {
	data, err := json.Marshal(lazysrv.Complete{BlobPath: s.content.blobPath(lr.Digest), Unpacked: unpacked})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(e.dir, lazysrv.CompleteFile), data, 0o600); err != nil {
		return fmt.Errorf("lazy layer %s: say it is complete: %w", lr.ChainID, err)
	}
	s.usage.changed()
	s.log.Info("lazy layer complete on disk", "layer", lr.ChainID, "blob", lr.Digest)
	return nil
}

// errDiffID is a blob whose decompressed stream is not the config's
// diff ID; errCorruptBlob a blob received whole that is not the image's
// (its digest or diff ID): not retried.
var (
	errDiffID      = errors.New("layer does not match its diff ID")
	errCorruptBlob = errors.New("layer blob is not the image's")
)

// PartialBlobFile, in a lazy layer's dir, is its blob as far as the
// background fetch wrote it, which the next try (after a failure or a
// restart of berthd) continues from the registry. Not in ingest/, which
// Open empties: the layer's dir outlives berthd, and goes with the
// layer.
const PartialBlobFile = "blob.partial"

// fetchWholeBlob fetches lr's blob into the content store (verified)
// through open and checks its diff ID, continuing the partial blob at
// partial; timeout without a byte stalls it. It returns the layer's
// unpacked size (its decompressed stream).
func (s *Store) fetchWholeBlob(ctx context.Context, lr layerMeta, open blobOpener, timeout time.Duration, partial string) (unpacked int64, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	count := &atomic.Int64{}
	stopWatch := watchProgress(ctx, cancel, count, timeout)
	defer stopWatch()
	bf, err := s.startResumableFetch(ctx, lr, open, count, partial)
	if err != nil {
		return 0, err
	}
	defer bf.close()
	src := &readErr{r: bf}
	unpacked, diffErr := checkDiffID(src, lr.DiffID)
	if src.err != nil {
		// The transfer broke: not the content's fault, retried.
		diffErr = src.err
	}
	if err := bf.finish(diffErr); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return 0, fmt.Errorf("%w: %w", cause, err)
		}
		if !errors.Is(err, errDiffID) && !errors.Is(err, errdefs.ErrInvalidArgument) {
			// The transfer broke: what arrived is kept for the next try.
			return 0, err
		}
		// The bytes are not the image's layer: none is kept.
		if bf.in != nil {
			bf.in.discard()
		}
		if bf.have > 0 {
			// Maybe the partial blob's fault (a file cut or changed
			// while berthd was away): fetched again from the start
			// before the layer is called corrupt.
			return 0, fmt.Errorf("layer resumed after %d bytes on disk, discarded: %w", bf.have, err)
		}
		// Every byte the manifest announced arrived, and it is not the
		// image's layer.
		if count.Load() >= lr.Size {
			return 0, fmt.Errorf("%w: %w", errCorruptBlob, err)
		}
		return 0, err
	}
	s.usage.changed()
	return unpacked, nil
}

// checkDiffID reads the gzip stream r to its end and compares the
// decompressed bytes' digest with diffID; it returns how many there were.
func checkDiffID(r io.Reader, diffID string) (int64, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errDiffID, err)
	}
	zr.Multistream(true)
	h := sha256.New()
	n, err := io.Copy(h, zr)
	if err != nil {
		return n, fmt.Errorf("%w: %w", errDiffID, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return n, fmt.Errorf("%w: %s, the config says %s", errDiffID, got, diffID)
	}
	return n, nil
}

// errBackgroundStalled ends a background fetch that received nothing for
// the progress timeout.
var errBackgroundStalled = errors.New("background fetch made no progress for image_pull_progress_timeout")

// watchProgress cancels ctx (with errBackgroundStalled) when count does
// not move for timeout; the returned func stops watching.
func watchProgress(ctx context.Context, cancel context.CancelCauseFunc, count *atomic.Int64, timeout time.Duration) func() {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(max(timeout/8, 10*time.Millisecond))
		defer tick.Stop()
		last, since := count.Load(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if n := count.Load(); n != last {
					last, since = n, now
				} else if now.Sub(since) >= timeout {
					cancel(errBackgroundStalled)
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// watchCorrupt looks for the server's corrupt mark in e's dir (a chunk
// that failed its digest, written by berth-lazy) for as long as the
// layer exists.
func (s *Store) watchCorrupt(ctx context.Context, chainID string, e *lazyEntry) {
	t := time.NewTicker(corruptPoll)
	defer t.Stop()
	for !e.marked.Load() {
		if why, ok := corruptMark(e.dir); ok {
			s.lazyMarked(chainID, e, errors.New("the lazy-layer server found a chunk that does not match its TOC digest: "+why))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// corruptMark reads dir's corrupt mark: what it says (its first KiB),
// and whether there is one.
func corruptMark(dir string) (string, bool) {
	f, err := os.Open(filepath.Join(dir, lazysrv.CorruptFile))
	if err != nil {
		return "", false
	}
	defer f.Close()
	why, _ := io.ReadAll(io.LimitReader(f, 1<<10))
	return strings.TrimSpace(string(why)), true
}

// markCorrupt writes the corrupt mark into e's dir itself (the blob
// berthd fetched is not the image's) and acts on it.
func (s *Store) markCorrupt(chainID string, e *lazyEntry, cause error) {
	if err := os.WriteFile(filepath.Join(e.dir, lazysrv.CorruptFile), []byte(cause.Error()+"\n"), 0o600); err != nil {
		s.log.Error("lazy layer: mark corrupt", "layer", chainID, "error", err)
	}
	s.lazyMarked(chainID, e, cause)
}

// lazyMarked acts once on a layer found corrupt (lazyCorrupt).
func (s *Store) lazyMarked(chainID string, e *lazyEntry, cause error) {
	if e.marked.CompareAndSwap(false, true) {
		s.log.Error("lazy layer failed verification", "layer", chainID, "error", cause)
		s.lazyCorrupt(chainID, cause)
	}
}

// lazyCorrupt is a lazy layer whose chunk failed its digest: counted,
// and every image that uses it is removed, so that it is not kept
// (containers reading it keep their leases and get EIO; the next pull
// fetches the image again).
func (s *Store) lazyCorrupt(chainID string, cause error) {
	s.lazy.corrupt.Add(1)
	// Not on the caller's goroutine: it may be a FUSE request, or the
	// layer's own watch, which removing the layer waits for.
	go func() {
		s.removeImagesOf(map[string]bool{chainID: true}, func(id string) {
			s.log.Error("image marked bad: a lazy layer failed verification", "image", id, "layer", chainID, "error", cause)
		})
		s.requestGC()
	}()
}

// removeImagesOf forgets every image that uses one of the layers
// chainIDs, telling say about each first.
func (s *Store) removeImagesOf(chainIDs map[string]bool, say func(id string)) error {
	var ids []string
	s.index.view(func(images map[string]*imageMeta) {
		for id, meta := range images {
			for _, l := range meta.Layers {
				if chainIDs[l.ChainID] {
					ids = append(ids, id)
					break
				}
			}
		}
	})
	var errs []error
	for _, id := range ids {
		say(id)
		if _, err := s.removeMeta(id); err != nil {
			errs = append(errs, fmt.Errorf("remove image %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
