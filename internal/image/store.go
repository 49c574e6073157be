// Package image is berth's image store: registry pulls, content-addressed
// blobs, image metadata, layers unpacked for overlayfs, and layer leases held
// by containers.
//
// Layout under <root>/images/ (docs/decisions/0100-image-store-layout.md):
//
//	blobs/sha256/<hex>     manifests, configs, compressed layers, verified by digest
//	records/<id-hex>.json  one image's metadata (tags, digests, manifest, layers)
//	layers/<chain-hex>/diff one unpacked layer, an overlayfs lower dir
//	leases/<owner>.json    layers pinned by a container
//	ingest/                downloads and unpacks in progress (emptied on start)
package image

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthcri/berth/internal/fault"
)

// Image is one stored image, as callers see it.
type Image struct {
	ID          string   // "sha256:<hex of config digest>"
	RepoTags    []string // docker.io/library/busybox:latest
	RepoDigests []string // docker.io/library/busybox@sha256:<manifest or index digest>
	Size        uint64
	Config      *ocispecv1.Image
	ChainIDs    []string // bottom layer first
	Pinned      bool
}

// Options configure a Store.
type Options struct {
	// Root is the store directory, <berth root>/images.
	Root string
	// RegistryConfigDir holds containerd-style <host>/hosts.toml files.
	RegistryConfigDir string
	// PinnedImages are references reported pinned and never removed by GC.
	PinnedImages []string
	// Limits bound each image's layers (when Settings is nil).
	Limits Limits
	Logger *slog.Logger
	// Observer, if set, hears about downloads (berthd's metrics).
	Observer PullObserver
	// Faults, for crash-recovery tests only, kills berthd at armed points
	// (nil in production).
	Faults *fault.Injector
	// PullProgressTimeout cancels a pull that received nothing from the
	// registry for this long; 0 never does.
	PullProgressTimeout time.Duration
	// RangeFetch is how large layer blobs are fetched in parallel ranges
	// (when Settings is nil); the zero value fetches each as one stream.
	RangeFetch RangeFetch
	// LazyPull serves eStargz layers lazily (when Settings is nil).
	LazyPull bool
	// LazyBackgroundQuiet is how long lazy layers' reads must have
	// stopped before a background fetch starts (when Settings is nil;
	// lazyquiet.go).
	LazyBackgroundQuiet time.Duration
	// LazyHolder keeps lazy layers' connections outside berthd (the
	// node's keeper); nil: eStargz layers are pulled whole.
	LazyHolder LazyHolder
	// LazySocket is where berthd answers the lazy-layer server's range
	// requests (default: lazy.sock in Root).
	LazySocket string
	// Settings, if set, gives the live settings each pull starts with
	// (berthd's reloadable configuration) and overrides RegistryConfigDir
	// and PullProgressTimeout.
	Settings func() PullSettings
}

// PullSettings are what a pull reads from the configuration, once, when it
// starts: a reload (SIGHUP) changes them for the pulls that start after it
// while the pulls in flight finish on theirs.
//
// The signature policy is one of them: a pull checks what it fetched
// against the policy it started with.
type PullSettings struct {
	// RegistryConfigDir holds containerd-style <host>/hosts.toml files.
	RegistryConfigDir string
	// ProgressTimeout cancels a pull that received nothing from the
	// registry for this long; 0 never does.
	ProgressTimeout time.Duration
	// SignaturePolicy, if set, decides which images may be stored
	// (pulls and imports); nil accepts every image.
	SignaturePolicy SignaturePolicy
	// RangeFetch is how large layer blobs are fetched in parallel ranges;
	// the zero value fetches each blob as one stream.
	RangeFetch RangeFetch
	// Limits bound what each image may unpack (pulls and imports).
	Limits Limits
	// LazyPull serves eStargz layers lazily (decision 3600).
	LazyPull bool
	// LazyBackgroundQuiet is how long lazy layers' reads must have
	// stopped before a lazy layer's background fetch starts (0: at once).
	LazyBackgroundQuiet time.Duration
}

// Limits bound what one image may make berthd unpack (decision 3420,
// [image_limits]); a zero limit is no limit.
type Limits struct {
	// MaxLayerSize bounds one layer's uncompressed stream and the
	// apparent size of its files.
	MaxLayerSize int64
	// MaxImageSize bounds the apparent size of the files of all the
	// layers one pull or import unpacks.
	MaxImageSize int64
	// MaxLayerEntries bounds one layer's tar entries.
	MaxLayerEntries int64
	// MaxLayerDirs bounds the directories one layer makes.
	MaxLayerDirs int64
}

// PullObserver is told how many bytes pulls download and how long
// successful pulls take.
type PullObserver interface {
	PulledBytes(n int64)
	PullDone(took time.Duration)
}

// Store holds images on disk. It is safe for concurrent use.
//
// It is the pull orchestration (pull.go, commit.go) and the exported API
// on top of parts that each own their state and lock
// (docs/decisions/2900-image-store-by-concern.md):
//
//	content  blobs by digest and ingests (content.go), no lock
//	layers   unpacked layers, overlayfs lower dirs (layers.go), no lock
//	index    image records, names and lookups (index.go), imageIndex.mu
//	refs     leases and in-flight references (lease.go), references.mu
//	gc       collection passes (gc.go), collector.mu
//	usage    the cached disk usage (usage.go), usageCache.mu
//	pulls, layerFetches  shared work in flight (flight.go), flight.mu
//	streams  bytes of the layer streams running now (progress.go)
//
// Lock order: imageIndex.mu before references.mu; no other lock is held
// while taking another.
type Store struct {
	dir      string
	settings func() PullSettings
	log      *slog.Logger
	observer PullObserver
	faults   *fault.Injector

	content *contentStore
	layers  *layerStore
	index   *imageIndex
	refs    *references
	gc      *collector
	usage   *usageCache

	pulls        flight[*Image]
	layerFetches flight[struct{}]
	// streams counts the bytes of the layer streams running now, for the
	// pulls' progress timeout.
	streams layerBytes
	// lazy are the layers served lazily (lazy.go).
	lazy lazyLayers
	// lazySock is the range socket's path ("" when there is none: no
	// layer is served lazily); ranges its listener (lazyserve.go).
	lazySock string
	ranges   *rangeSocket
}

// Open loads the store, throwing away what interrupted pulls left behind:
// the ingest dir, half-unpacked layers, and blobs and layers no image or
// lease refers to.
func Open(opts Options) (*Store, error) {
	s := newStore(opts)
	for _, d := range []string{"ingest", "trash"} {
		if err := os.RemoveAll(s.path(d)); err != nil {
			return nil, fmt.Errorf("clean image %s dir: %w", d, err)
		}
	}
	for _, d := range []string{"blobs/sha256", "records", "layers", "leases", "ingest", "trash"} {
		if err := os.MkdirAll(s.path(d), 0o700); err != nil {
			return nil, fmt.Errorf("create image store dir: %w", err)
		}
	}
	// A placement hint, never a reason not to start.
	if ok, err := MarkTopDir(s.path("ingest")); err != nil {
		s.log.Warn("image store: layer placement hint", "error", err)
	} else {
		s.log.Debug("image store: layer placement hint", "topdir", ok)
	}
	if err := s.index.load(s.log); err != nil {
		return nil, err
	}
	if err := s.refs.load(); err != nil {
		return nil, err
	}
	s.listenRanges()
	if err := s.lazyAtStart(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.collectAtStart(); err != nil {
		// Keeping garbage is safe; refusing to start is not useful.
		s.log.Warn("image store cleanup at start failed", "error", err)
	}
	return s, nil
}

// newStore wires the parts of a store rooted at opts.Root; nothing on
// disk yet.
func newStore(opts Options) *Store {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		dir:      opts.Root,
		settings: opts.Settings,
		log:      log,
		observer: opts.Observer,
		faults:   opts.Faults,
		content:  &contentStore{dir: opts.Root},
		layers:   &layerStore{dir: opts.Root},
		usage:    &usageCache{dir: opts.Root, trash: filepath.Join(opts.Root, "trash")},
	}
	s.usage.skip = s.lazy.isMount
	s.lazy.holder, s.lazy.log = opts.LazyHolder, log
	s.lazySock = opts.LazySocket
	if s.lazySock == "" {
		s.lazySock = filepath.Join(opts.Root, "lazy.sock")
	}
	if s.settings == nil {
		static := PullSettings{RegistryConfigDir: opts.RegistryConfigDir, ProgressTimeout: opts.PullProgressTimeout, RangeFetch: opts.RangeFetch, Limits: opts.Limits, LazyPull: opts.LazyPull, LazyBackgroundQuiet: opts.LazyBackgroundQuiet}
		s.settings = func() PullSettings { return static }
	}
	s.index = &imageIndex{
		dir: s.path("records"), content: s.content, layers: s.layers,
		changed: s.usage.changed, images: map[string]*imageMeta{},
	}
	s.index.lazyOnDisk = s.lazy.onDisk
	for _, p := range opts.PinnedImages {
		if n, err := ParseReference(p); err == nil {
			s.index.pinned = append(s.index.pinned, n.String())
		} else {
			s.index.pinned = append(s.index.pinned, p)
		}
	}
	s.refs = &references{
		dir: s.path("leases"), faults: opts.Faults, log: log,
		inUse: map[string]int{}, leases: map[string]*lease{},
	}
	s.gc = &collector{pass: s.collect, log: log}
	return s
}

// Dir is the store's directory (the image filesystem for ImageFsInfo).
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

// LayerDiffDir is the unpacked content of a layer, an overlayfs lower dir.
func (s *Store) LayerDiffDir(chainID string) string { return s.layers.diffDir(chainID) }

// Get returns the image ref names; errdefs.ErrNotFound when there is none.
func (s *Store) Get(ref string) (*Image, error) { return s.index.get(ref) }

// List returns every image, ordered by ID.
func (s *Store) List() []*Image { return s.index.list() }

// ConfigJSON is the image's config blob as stored.
func (s *Store) ConfigJSON(id string) ([]byte, error) {
	var digest string
	err := s.index.withImage(id, func(meta *imageMeta) error {
		digest = meta.ConfigDigest
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s.content.read(digest)
}

// Remove deletes the image ref names with all its tags and digests, and
// frees the layers no other image or container uses. A missing image is not
// an error (RemoveImage is idempotent).
func (s *Store) Remove(ref string) error {
	removed, err := s.removeMeta(ref)
	if err != nil || !removed {
		return err
	}
	// As containerd's synchronous delete: the space is free when
	// RemoveImage returns (the kubelet's image GC frees disk this way).
	s.WaitGC()
	return nil
}

// removeMeta forgets the image ref names; removed is false when there was
// none.
func (s *Store) removeMeta(ref string) (removed bool, _ error) {
	meta, err := s.index.remove(ref, func(meta *imageMeta) {
		s.log.Info("image removed", "image", meta.ID, "tags", meta.RepoTags)
		s.faults.Hit(fault.ImageMidRemove, "image", meta.ID)
	})
	return meta != nil, err
}
