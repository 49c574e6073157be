package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/fuseconn"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
)

// Lazy layers (decision 3600): an eStargz layer of a pulled image whose
// manifest names its TOC digest is not downloaded: its TOC is fetched and
// verified, the files the image prioritized are prefetched, and the layer
// is a FUSE filesystem mounted on its diff dir, so that overlayfs and
// everything above it see a layer directory as for any other. Its other
// chunks come by range requests when a container reads them, each
// verified against the TOC.
//
// berthd mounts (fuseconn.Mount: it has CAP_SYS_ADMIN), writes everything
// a server needs into the layer dir (lazy.json, fuse.json, toc.gz, the
// prefetched chunks in cache/), and hands the connection to the node's
// keeper (LazyHolder), whose child berth-lazy (internal/lazy/lazysrv)
// serves it, so that the layer outlives berthd (S4). berthd keeps what
// needs the registry's credentials (decision 3410): the answers to the
// server's range requests on lazy.sock (lazyserve.go) and the background
// fetch of the whole blob (lazyfetch.go), which says complete.json when
// it has it verified; the server then writes the files out and reads
// them locally. Without a holder, or when it refuses the layer, the layer
// is pulled whole.

// LazyHolder keeps lazy layers' FUSE connections alive outside berthd
// (the node's keeper, which runs berth-lazy to serve them).
type LazyHolder interface {
	// Hold hands the layer chainID, whose dir is layerDir, on conn (the
	// caller closes its own copy afterwards).
	Hold(ctx context.Context, chainID, layerDir string, conn *os.File) error
	// Drop lets go of the layer (after its mount was detached).
	Drop(ctx context.Context, chainID string) error
	// Held lists the chain IDs held.
	Held(ctx context.Context) ([]string, error)
}

// lazyDropTimeout bounds one Drop (the collector waits for it).
const lazyDropTimeout = 10 * time.Second

// lazyLayers are the lazy layers of this store, by chain ID.
type lazyLayers struct {
	holder  LazyHolder // nil: layers are pulled whole
	log     *slog.Logger
	mu      sync.Mutex
	entries map[string]*lazyEntry
	corrupt atomic.Int64
	// lastRead is when (Unix ns) a lazy layer was last read from its
	// registry, or a background fetch last began to wait (lazyquiet.go).
	lastRead atomic.Int64
}

// lazyEntry is one lazy layer: its dir, its mount, where its bytes come
// from, and its background fetch (stopped and waited for when it goes).
type lazyEntry struct {
	dir   string // layers/<chain>
	mount string // its diff dir
	// src is the blob on its registry (the range socket's answers); nil
	// when berthd has no way to the registry for it (reattached without
	// one): the server then reads what is on disk only.
	src lazy.Source
	// marked is set once the layer was found corrupt (counted once).
	marked  atomic.Bool
	stop    context.CancelFunc
	fetched chan struct{} // closed when the fetch and the watch ended
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

// source is the registry source of the lazy layer chainID, for the range
// socket.
func (z *lazyLayers) source(chainID string) (lazy.Source, bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	e := z.entries[chainID]
	if e == nil || e.src == nil {
		return nil, false
	}
	z.touch()
	return e.src, true
}

// onDisk is the bytes of the verified chunks the lazy layer chainID
// keeps in its cache, while its background fetch has not completed it.
func (z *lazyLayers) onDisk(chainID string) (int64, bool) {
	z.mu.Lock()
	e := z.entries[chainID]
	z.mu.Unlock()
	if e == nil {
		return 0, false
	}
	if _, err := os.Stat(filepath.Join(e.dir, lazysrv.CompleteFile)); err == nil {
		return 0, false
	}
	var n int64
	// The server writes and drops chunk files as it goes: a file gone
	// mid-walk is not an error.
	_ = filepath.WalkDir(filepath.Join(e.dir, lazysrv.CacheDir), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Size()
		}
		return nil
	})
	return n, true
}

// setSource gives the lazy layer chainID its registry source.
func (z *lazyLayers) setSource(chainID string, src lazy.Source) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if e := z.entries[chainID]; e != nil {
		e.src = src
	}
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
		if e.mount == dir {
			return true
		}
	}
	return false
}

// unmount stops the background fetch of the lazy layer chainID, waits
// for it, detaches the layer and tells the holder to let it go, if there
// is one. The connection ends once nothing uses the mount any more.
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
	if err := fuseconn.Unmount(e.mount); err != nil {
		return fmt.Errorf("lazy layer %s: %w", chainID, err)
	}
	z.drop(chainID)
	return nil
}

// drop tells the holder to let go of chainID; a failure is logged (the
// layer's dir goes all the same; the keeper's copy of a detached
// connection is only an fd).
func (z *lazyLayers) drop(chainID string) {
	if err := z.tryDrop(chainID); err != nil {
		z.log.Warn("lazy layer: the node's keeper did not let it go", "layer", chainID, "error", err)
	}
}

// tryDrop tells the holder to let go of chainID, bounded.
func (z *lazyLayers) tryDrop(chainID string) error {
	if z.holder == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), lazyDropTimeout)
	defer cancel()
	return z.holder.Drop(ctx, chainID)
}

// stopAll stops every background fetch and waits for them; the layers
// stay mounted and held (they outlive berthd, decision 3600 S4).
func (z *lazyLayers) stopAll() {
	z.mu.Lock()
	var es []*lazyEntry
	for _, e := range z.entries {
		es = append(es, e)
	}
	z.mu.Unlock()
	for _, e := range es {
		e.stop()
		<-e.fetched
	}
}

// LazyCorruptChunks counts the lazy layers found with a chunk (or a
// blob) that failed its digest since start (berthd's metric).
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

// rangeSource is src as berthd answers the server's range requests from
// it: with the pull's retries and request timeout.
func rangeSource(src lazy.Source, rb registryBlobs) lazy.Source {
	return &retrySource{src: src, retries: rb.set.Retries, timeout: rb.lazyTimeout}
}

// errNotLazy: the layer cannot be served lazily; it is pulled whole.
var errNotLazy = errors.New("layer not served lazily")

// lazyLayer mounts lr, an eStargz layer, lazily: layer dir committed
// into layers/ with its lazy.json and chunk cache, TOC fetched, verified
// and written to toc.gz, prioritized files prefetched, the filesystem
// mounted on its diff dir and handed to the holder. errNotLazy (wrapped)
// means it cannot be served so (the registry serves no ranges, no holder
// takes it) and nothing was left; the caller pulls it whole.
func (s *Store) lazyLayer(ctx context.Context, lr layerMeta, rb registryBlobs) (err error) {
	if s.lazy.holder == nil || s.lazySock == "" {
		return fmt.Errorf("layer %s: %w: no lazy-layer server on this node", lr.Digest, errNotLazy)
	}
	dir, err := s.commitLazyDir(lr)
	if err != nil {
		return err
	}
	// In layers/ now: a failure below trashes it (the pull's marks keep
	// the collector off it meanwhile).
	var mounted, held bool
	defer func() {
		if err != nil {
			s.undoLazyLayer(lr.ChainID, mounted, held)
		}
	}()
	// Every byte of the TOC and the prefetch counts as the pull's
	// progress (decision 1511).
	count, stopCount := s.streams.start(lr.ChainID)
	defer stopCount()
	src := &registrySource{c: rb.c, digest: lr.Digest, size: lr.Size}
	l, err := lazy.Open(ctx, src, lr.TOCDigest, lazy.Options{
		CacheDir:       filepath.Join(dir, lazysrv.CacheDir),
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
	defer l.Close()
	// The server reads the prefetched chunks from cache/ and asks for the
	// rest.
	if err := l.Prefetch(ctx); err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.Digest, classify(err))
	}
	if err := atomicfile.Write(filepath.Join(dir, lazysrv.TOCFile), l.TOCTail(), 0o600); err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.Digest, err)
	}
	dev, settings, err := fuseconn.Mount(s.layers.diffDir(lr.ChainID), &lazy.HeldOptions().MountOptions)
	if err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.Digest, err)
	}
	mounted = true
	// Closed once the holder has its copy: berthd keeps none (closing
	// the last copy would abort the connection, which is what a failed
	// pull wants).
	defer dev.Close()
	if err := settings.Save(filepath.Join(dir, lazysrv.SettingsFile)); err != nil {
		return fmt.Errorf("lazy layer %s: %w", lr.Digest, err)
	}
	held = true
	if err := s.lazy.holder.Hold(ctx, lr.ChainID, dir, dev); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("lazy layer %s: hand it to the node's keeper: %w", lr.Digest, err)
		}
		return fmt.Errorf("layer %s: %w: the node's keeper did not take it: %w", lr.Digest, errNotLazy, err)
	}
	s.startLazy(lr.ChainID, &lazyEntry{dir: dir, mount: s.layers.diffDir(lr.ChainID), src: rangeSource(src, rb)}, func(ctx context.Context, e *lazyEntry) {
		s.backgroundFetch(ctx, lr, rb, e)
	})
	s.log.Info("layer mounted lazily", "layer", lr.ChainID, "blob", lr.Digest, "prefetched_bytes", l.FetchedBytes())
	return nil
}

// commitLazyDir makes lr's layer dir in layers/: lazy.json (naming the
// range socket) and an empty chunk cache.
func (s *Store) commitLazyDir(lr layerMeta) (string, error) {
	tx, err := s.layers.prepare(lr.ChainID)
	if err != nil {
		return "", err
	}
	defer tx.abort()
	meta, err := json.Marshal(lazysrv.Meta{Blob: lr.Digest, Size: lr.Size, TOCDigest: lr.TOCDigest, Socket: s.lazySock})
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tx.path, lazysrv.MetaFile), meta, 0o600); err != nil {
		return "", fmt.Errorf("lazy layer %s: %w", lr.ChainID, err)
	}
	if err := os.Mkdir(filepath.Join(tx.path, lazysrv.CacheDir), 0o700); err != nil {
		return "", fmt.Errorf("lazy layer %s: %w", lr.ChainID, err)
	}
	if err := tx.commit(); err != nil {
		return "", err
	}
	return s.layers.layerDir(lr.ChainID), nil
}

// undoLazyLayer removes what a failed lazyLayer left: the mount (its
// connection aborts with berthd's copy of the fd), the holder's copy if
// it may have taken one, the layer dir.
func (s *Store) undoLazyLayer(chainID string, mounted, held bool) {
	if mounted {
		if err := fuseconn.Unmount(s.layers.diffDir(chainID)); err != nil {
			s.log.Warn("lazy layer: unmount after a failed pull", "layer", chainID, "error", err)
		}
	}
	if held {
		// The hold may have reached the keeper before it failed; most
		// often it did not, and the drop's failure says nothing new.
		if err := s.lazy.tryDrop(chainID); err != nil {
			s.log.Debug("lazy layer: drop after a failed hold", "layer", chainID, "error", err)
		}
	}
	if err := s.layers.trash(strings.TrimPrefix(chainID, "sha256:")); err != nil {
		s.log.Warn("lazy layer: remove after a failed pull", "layer", chainID, "error", err)
	}
	s.layers.emptyTrash(s.log)
}

// startLazy registers e as the lazy layer chainID and starts, for as
// long as it exists, fetch (its background fetch) and the watch for the
// server's corrupt mark.
func (s *Store) startLazy(chainID string, e *lazyEntry, fetch func(context.Context, *lazyEntry)) {
	bg, stop := context.WithCancel(context.Background())
	e.stop, e.fetched = stop, make(chan struct{})
	s.lazy.add(chainID, e)
	s.usage.changed()
	go func() {
		defer close(e.fetched)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watchCorrupt(bg, chainID, e)
		}()
		if fetch != nil {
			fetch(bg, e)
		}
		wg.Wait()
	}()
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
