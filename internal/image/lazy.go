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
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/lazy"
)

// Lazy layers (decision 3600, stage S2): an eStargz layer of a pulled
// image whose manifest names its TOC digest is not downloaded: its TOC is
// fetched and verified, the files the image prioritized are prefetched,
// and the layer is served by a FUSE filesystem (internal/lazy) mounted on
// its diff dir, so that overlayfs and everything above it see a layer
// directory as for any other. Its other chunks come by range requests
// when a container reads them, each verified against the TOC.
//
// The rest of the layer comes in the background (S3, below); once it is
// verified, its files are written out under its cache and the filesystem
// serves them at local speed (FUSE passthrough; internal/lazy/local.go).
// What is not done yet (S4): survive the end of berthd. The filesystem is
// served by berthd itself, so a berthd that ends takes its lazy layers
// with it: at start, a layer left from a previous berthd is removed with
// the images that use it (the kubelet pulls them again), and containers
// still reading it get ENOTCONN.

// lazyMeta is layers/<chain>/lazy.json: what the layer is served from.
type lazyMeta struct {
	Blob      string `json:"blob"`
	Size      int64  `json:"size"`
	TOCDigest string `json:"tocDigest"`
}

const lazyMetaFile = "lazy.json"

// lazyLayers are the layers this berthd serves lazily, by chain ID.
type lazyLayers struct {
	mu      sync.Mutex
	entries map[string]*lazyEntry
	corrupt atomic.Int64
}

// lazyEntry is one lazy layer: its chunks, its mount, and its background
// fetch (stopped and waited for when the layer goes).
type lazyEntry struct {
	layer   *lazy.Layer
	mount   *lazy.Mounted
	stop    context.CancelFunc
	fetched chan struct{} // closed when the background fetch ended
}

// count is how many layers are served lazily.
func (z *lazyLayers) count() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return len(z.entries)
}

func (z *lazyLayers) get(chainID string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	_, ok := z.entries[chainID]
	return ok
}

// onDisk is the bytes of verified chunks the lazy layer chainID keeps,
// while its background fetch has not completed it.
func (z *lazyLayers) onDisk(chainID string) (int64, bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	e := z.entries[chainID]
	if e == nil || e.layer.Local() {
		return 0, false
	}
	return e.layer.CachedBytes(), true
}

func (z *lazyLayers) add(chainID string, e *lazyEntry) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.entries == nil {
		z.entries = map[string]*lazyEntry{}
	}
	z.entries[chainID] = e
}

// isMount reports whether dir is the mountpoint of a lazy layer (the
// disk usage walk does not enter them: their files are not on disk).
func (z *lazyLayers) isMount(dir string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, e := range z.entries {
		if e.mount.Dir == dir {
			return true
		}
	}
	return false
}

// unmount stops the background fetch of the lazy layer chainID, waits
// for it, and detaches the layer, if there is one.
func (z *lazyLayers) unmount(chainID string) error {
	z.mu.Lock()
	e := z.entries[chainID]
	delete(z.entries, chainID)
	z.mu.Unlock()
	if e == nil {
		return nil
	}
	e.stop()
	<-e.fetched
	err := e.mount.Unmount()
	e.layer.Close()
	return err
}

func (z *lazyLayers) unmountAll() error {
	z.mu.Lock()
	var ids []string
	for id := range z.entries {
		ids = append(ids, id)
	}
	z.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, z.unmount(id))
	}
	return errors.Join(errs...)
}

// LazyCorruptChunks counts the chunks of lazy layers that failed their
// digest since start (berthd's metric).
func (s *Store) LazyCorruptChunks() int64 { return s.lazy.corrupt.Load() }

// registrySource is a layer blob on the registry of the pull that found
// it, read in ranges.
type registrySource struct {
	c      *repoClient
	digest string
	size   int64
}

func (r *registrySource) Size() int64 { return r.size }

func (r *registrySource) OpenRange(ctx context.Context, start, end int64) (io.ReadCloser, error) {
	body, partial, err := r.c.openBlobRange(ctx, r.digest, start, end)
	if err != nil {
		return nil, err
	}
	if !partial {
		body.Close()
		return nil, lazy.ErrNoRanges
	}
	return body, nil
}

// errNotLazy: the layer cannot be served lazily; it is pulled whole.
var errNotLazy = errors.New("layer not served lazily")

// lazyLayer mounts lr, an eStargz layer, lazily: layer dir committed
// into layers/ with its lazy.json and chunk cache, TOC fetched and
// verified, prioritized files prefetched, filesystem mounted on its diff
// dir. errNotLazy (wrapped) means the registry cannot serve it so and
// nothing was left; the caller pulls it whole.
func (s *Store) lazyLayer(ctx context.Context, lr layerMeta, rb registryBlobs) (err error) {
	tx, err := s.layers.prepare(lr.ChainID)
	if err != nil {
		return err
	}
	defer tx.abort()
	meta, err := json.Marshal(lazyMeta{Blob: lr.Digest, Size: lr.Size, TOCDigest: lr.TOCDigest})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tx.path, lazyMetaFile), meta, 0o600); err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.ChainID, err)
	}
	if err := os.Mkdir(filepath.Join(tx.path, "cache"), 0o700); err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.ChainID, err)
	}
	if err := tx.commit(); err != nil {
		return err
	}
	// In layers/ now: a failure below trashes it (the pull's marks keep
	// the collector off it meanwhile).
	hexName := strings.TrimPrefix(lr.ChainID, "sha256:")
	var mounted *lazy.Mounted
	defer func() {
		if err == nil {
			return
		}
		if mounted != nil {
			if uerr := mounted.Unmount(); uerr != nil {
				s.log.Warn("lazy layer: unmount after a failed pull", "layer", lr.ChainID, "error", uerr)
			}
		}
		if terr := s.layers.trash(hexName); terr != nil {
			s.log.Warn("lazy layer: remove after a failed pull", "layer", lr.ChainID, "error", terr)
		}
		s.layers.emptyTrash(s.log)
	}()
	// Every byte of the TOC and the prefetch counts as the pull's
	// progress (decision 1511).
	count, stopCount := s.streams.start(lr.ChainID)
	defer stopCount()
	src := &registrySource{c: rb.c, digest: lr.Digest, size: lr.Size}
	l, err := lazy.Open(ctx, src, lr.TOCDigest, lazy.Options{
		CacheDir:       filepath.Join(s.layers.layerDir(lr.ChainID), "cache"),
		Log:            s.log.With("layer", lr.ChainID),
		OnCorrupt:      func(err error) { s.lazyCorrupt(lr.ChainID, err) },
		Retries:        rb.set.Retries,
		Progress:       count,
		RequestTimeout: rb.lazyTimeout,
	})
	if errors.Is(err, lazy.ErrNoRanges) {
		return fmt.Errorf("layer %s: %w: %w", lr.Digest, errNotLazy, err)
	}
	if err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.Digest, classify(err))
	}
	if err := l.Prefetch(ctx); err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.Digest, classify(err))
	}
	if mounted, err = lazy.Mount(s.layers.diffDir(lr.ChainID), l); err != nil {
		return err
	}
	bg, stop := context.WithCancel(context.Background())
	e := &lazyEntry{layer: l, mount: mounted, stop: stop, fetched: make(chan struct{})}
	s.lazy.add(lr.ChainID, e)
	s.usage.changed()
	s.log.Info("layer mounted lazily", "layer", lr.ChainID, "blob", lr.Digest, "prefetched_bytes", l.FetchedBytes())
	go func() {
		defer close(e.fetched)
		s.backgroundFetch(bg, lr, rb, l)
	}()
	return nil
}

// Background fetch (stage S3): the whole blob of a lazy layer comes in
// behind the containers' reads, through the same fetch as a full pull
// (blobFetch: ranged for large blobs, its digest and size checked), its
// decompressed stream checked against the config's diff ID; then the
// layer reads every chunk from it, and the node ends with the whole
// image as after a full pull; then its files are written out (materialize)
// and its chunk cache dropped. A registry that fails or stalls
// (image_pull_progress_timeout without a byte) is tried again with
// back-off, from 1 s doubling to a minute, until the fetch completes or
// the layer goes.

const (
	backgroundRetryFirst = time.Second
	backgroundRetryMax   = time.Minute
)

func (s *Store) backgroundFetch(ctx context.Context, lr layerMeta, rb registryBlobs, l *lazy.Layer) {
	delay := backgroundRetryFirst
	for {
		unpacked, err := s.fetchWholeBlob(ctx, lr, rb, l)
		if err == nil {
			s.materialize(ctx, lr, l, unpacked)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errCorruptBlob) {
			// The registry's bytes are not the image's: not kept.
			l.MarkCorrupt(err)
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

// materialize writes the complete layer's files out (lazy.Layer.Materialize),
// so that the filesystem serves them at local speed (FUSE passthrough),
// and drops its chunk cache; the files may not add up to more than the
// layer's unpacked bytes, as a full pull's could not. A failure (the disk
// full) is logged: reads go on from the verified blob, only slower.
func (s *Store) materialize(ctx context.Context, lr layerMeta, l *lazy.Layer, unpacked int64) {
	defer s.usage.changed()
	if err := l.Materialize(ctx, unpacked); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("lazy layer: write its files out; reads go on from its blob", "layer", lr.ChainID, "error", err)
		}
		return
	}
	s.log.Info("lazy layer files local", "layer", lr.ChainID)
}

// errDiffID is a blob whose decompressed stream is not the config's
// diff ID; errCorruptBlob a blob received whole that is not the image's
// (its digest or diff ID): not retried.
var (
	errDiffID      = errors.New("layer does not match its diff ID")
	errCorruptBlob = errors.New("layer blob is not the image's")
)

// fetchWholeBlob fetches lr's blob into the content store (verified)
// and checks its diff ID, then has l read from it. It returns the
// layer's unpacked size (its decompressed stream).
func (s *Store) fetchWholeBlob(ctx context.Context, lr layerMeta, rb registryBlobs, l *lazy.Layer) (unpacked int64, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	count := &atomic.Int64{}
	stopWatch := watchProgress(ctx, cancel, count, rb.lazyTimeout)
	defer stopWatch()
	bf, err := s.startBlobFetch(ctx, lr, rb, count)
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
		// Every byte the manifest announced arrived, and it is not the
		// image's layer.
		if count.Load() >= lr.Size && (errors.Is(err, errDiffID) || errors.Is(err, errdefs.ErrInvalidArgument)) {
			return 0, fmt.Errorf("%w: %w", errCorruptBlob, err)
		}
		return 0, err
	}
	f, err := s.content.open(lr.Digest)
	if err != nil {
		return 0, err
	}
	l.UseLocal(f)
	s.usage.changed()
	s.log.Info("lazy layer complete on disk", "layer", lr.ChainID, "blob", lr.Digest)
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

// lazyCorrupt is a lazy layer whose chunk failed its digest: counted,
// logged (by the layer), and every image that uses it is removed, so that
// it is not kept (containers reading it keep their leases and get EIO;
// the next pull fetches the image again).
func (s *Store) lazyCorrupt(chainID string, cause error) {
	s.lazy.corrupt.Add(1)
	// Not on the reader's goroutine: it is a FUSE request.
	go func() {
		var ids []string
		s.index.view(func(images map[string]*imageMeta) {
			for id, meta := range images {
				for _, l := range meta.Layers {
					if l.ChainID == chainID {
						ids = append(ids, id)
						break
					}
				}
			}
		})
		for _, id := range ids {
			s.log.Error("image marked bad: a lazy layer failed verification", "image", id, "layer", chainID, "error", cause)
			if _, err := s.removeMeta(id); err != nil {
				s.log.Warn("remove bad image", "image", id, "error", err)
			}
		}
		s.requestGC()
	}()
}

// dropLazyAtStart removes the lazy layers a previous berthd served (their
// filesystem ended with it) and the images that use them: stale mounts
// detached, layers moved to trash whatever holds them.
func (s *Store) dropLazyAtStart() error {
	es, err := s.layers.list()
	if err != nil {
		return err
	}
	dropped := map[string]bool{}
	for _, e := range es {
		if _, err := os.Stat(s.layers.path("layers", e.Name(), lazyMetaFile)); err != nil {
			continue
		}
		diff := s.layers.path("layers", e.Name(), "diff")
		if err := unix.Unmount(diff, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			s.log.Warn("lazy layer left by a previous berthd: unmount", "layer", e.Name(), "error", err)
		}
		if err := s.layers.trash(e.Name()); err != nil {
			return fmt.Errorf("remove lazy layer %s left by a previous berthd: %w", e.Name(), err)
		}
		dropped["sha256:"+e.Name()] = true
	}
	if len(dropped) == 0 {
		return nil
	}
	var ids []string
	s.index.view(func(images map[string]*imageMeta) {
		for id, meta := range images {
			for _, l := range meta.Layers {
				if dropped[l.ChainID] {
					ids = append(ids, id)
					break
				}
			}
		}
	})
	for _, id := range ids {
		s.log.Warn("image with a lazy layer from a previous berthd removed; it is pulled again when needed", "image", id)
		if _, err := s.removeMeta(id); err != nil {
			return err
		}
	}
	return nil
}

// lazyTimeoutOf is how long one range request of a lazy layer may take:
// the pull progress timeout (decision 1511), or a minute when it is off.
func lazyTimeoutOf(set PullSettings) time.Duration {
	if set.ProgressTimeout > 0 {
		return set.ProgressTimeout
	}
	return time.Minute
}

// readErr remembers the first error of r other than io.EOF.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}
