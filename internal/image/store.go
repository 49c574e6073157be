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
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/diskusage"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/idprefix"
)

const metaVersion = 1

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
	Unpack       UnpackOptions
	Logger       *slog.Logger
	// Observer, if set, hears about downloads (berthd's metrics).
	Observer PullObserver
	// Faults, for crash-recovery tests only, kills berthd at armed points
	// (nil in production).
	Faults *fault.Injector
	// PullProgressTimeout cancels a pull that received nothing from the
	// registry for this long; 0 never does.
	PullProgressTimeout time.Duration
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
}

// PullObserver is told how many bytes pulls download and how long
// successful pulls take.
type PullObserver interface {
	PulledBytes(n int64)
	PullDone(took time.Duration)
}

// Store holds images on disk. It is safe for concurrent use.
type Store struct {
	dir      string
	settings func() PullSettings
	unpack   UnpackOptions
	log      *slog.Logger
	pinned   []string
	observer PullObserver
	faults   *fault.Injector

	mu     sync.Mutex
	images map[string]*imageMeta // by ID
	inUse  map[string]int        // digests and chain IDs a pull, import or export is using (markInUse)
	leases map[string]*lease     // by owner; each also on disk (lease.go)

	// gc schedules collection passes (gc.go).
	gcMu sync.Mutex
	gc   gcState
	// gcListed, tests only, runs in each pass between listing and deciding.
	gcListed func()

	// usage caches the last walk of the store; gen counts changes to it.
	usageMu    sync.Mutex
	usage      Usage
	usageGen   uint64
	usageValid bool
	usageAt    time.Time
	gen        uint64

	pulls  flight[*Image]
	layers flight[struct{}]
	// streams counts the bytes of the layer streams running now, for the
	// pulls' progress timeout.
	streams layerBytes
}

// imageMeta is what the store knows about one image, kept as JSON in
// records/<id-hex>.json (the directory keeps its first name on disk).
type imageMeta struct {
	Version        int         `json:"version"`
	ID             string      `json:"id"`
	RepoTags       []string    `json:"repoTags"`
	RepoDigests    []string    `json:"repoDigests"`
	ManifestDigest string      `json:"manifestDigest"`
	ConfigDigest   string      `json:"configDigest"`
	Layers         []layerMeta `json:"layers"`
	Size           uint64      `json:"size"`

	config *ocispecv1.Image
}

type layerMeta struct {
	Digest    string `json:"digest"`
	MediaType string `json:"mediaType"`
	Size      int64  `json:"size"`
	DiffID    string `json:"diffID"`
	ChainID   string `json:"chainID"`
}

// Open loads the store, throwing away what interrupted pulls left behind:
// the ingest dir, half-unpacked layers, and blobs and layers no image or
// lease refers to.
func Open(opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		dir:      opts.Root,
		settings: opts.Settings,
		unpack:   opts.Unpack,
		log:      log,
		images:   map[string]*imageMeta{},
		inUse:    map[string]int{},
		leases:   map[string]*lease{},
		observer: opts.Observer,
		faults:   opts.Faults,
	}
	if s.settings == nil {
		static := PullSettings{RegistryConfigDir: opts.RegistryConfigDir, ProgressTimeout: opts.PullProgressTimeout}
		s.settings = func() PullSettings { return static }
	}
	for _, p := range opts.PinnedImages {
		if n, err := ParseReference(p); err == nil {
			s.pinned = append(s.pinned, n.String())
		} else {
			s.pinned = append(s.pinned, p)
		}
	}
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
		log.Warn("image store: layer placement hint", "error", err)
	} else {
		log.Debug("image store: layer placement hint", "topdir", ok)
	}
	entries, err := os.ReadDir(s.path("records"))
	if err != nil {
		return nil, fmt.Errorf("read image metadata: %w", err)
	}
	for _, e := range entries {
		p := s.path("records", e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
			os.Remove(p) // a temp file from an interrupted write
			continue
		}
		meta, err := s.loadMeta(p)
		if err != nil {
			log.Warn("dropping unreadable image metadata", "path", p, "error", err)
			os.Remove(p)
			continue
		}
		s.images[meta.ID] = meta
	}
	if err := s.loadLeases(); err != nil {
		return nil, err
	}
	if err := s.collectAtStart(); err != nil {
		// Keeping garbage is safe; refusing to start is not useful.
		log.Warn("image store cleanup at start failed", "error", err)
	}
	return s, nil
}

// Dir is the store's directory (the image filesystem for ImageFsInfo).
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

func (s *Store) blobPath(digest string) string {
	return s.path("blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

func (s *Store) layerDir(chainID string) string {
	return s.path("layers", strings.TrimPrefix(chainID, "sha256:"))
}

// LayerDiffDir is the unpacked content of a layer, an overlayfs lower dir.
func (s *Store) LayerDiffDir(chainID string) string {
	return filepath.Join(s.layerDir(chainID), "diff")
}

func (s *Store) loadMeta(p string) (*imageMeta, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var meta imageMeta
	if err := json.Unmarshal(data, &meta); err != nil {
		return nil, err
	}
	if meta.Version != metaVersion {
		return nil, fmt.Errorf("metadata version %d, want %d", meta.Version, metaVersion)
	}
	cfgData, err := os.ReadFile(s.blobPath(meta.ConfigDigest))
	if err != nil {
		return nil, fmt.Errorf("config blob: %w", err)
	}
	var cfg ocispecv1.Image
	if err := json.Unmarshal(cfgData, &cfg); err != nil {
		return nil, fmt.Errorf("config blob: %w", err)
	}
	meta.config = &cfg
	for _, l := range meta.Layers {
		if _, err := os.Stat(s.LayerDiffDir(l.ChainID)); err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.ChainID, err)
		}
	}
	return &meta, nil
}

// writeMeta persists meta. Caller holds s.mu.
func (s *Store) writeMeta(meta *imageMeta) error {
	s.gen++
	meta.Version = metaVersion
	data, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path("records", strings.TrimPrefix(meta.ID, "sha256:")+".json"), data, 0o600)
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Store) toImage(meta *imageMeta) *Image {
	img := &Image{
		ID:          meta.ID,
		RepoTags:    slices.Clone(meta.RepoTags),
		RepoDigests: slices.Clone(meta.RepoDigests),
		Size:        meta.Size,
		Config:      meta.config,
	}
	for _, l := range meta.Layers {
		img.ChainIDs = append(img.ChainIDs, l.ChainID)
	}
	for _, p := range s.pinned {
		if p == meta.ID || slices.Contains(meta.RepoTags, p) || slices.Contains(meta.RepoDigests, p) {
			img.Pinned = true
		}
	}
	if img.RepoTags == nil {
		img.RepoTags = []string{}
	}
	if img.RepoDigests == nil {
		img.RepoDigests = []string{}
	}
	return img
}

// lookup finds an image by ID, unambiguous ID prefix, name:tag or
// name@digest (short names normalized). Caller holds s.mu.
func (s *Store) lookup(ref string) (*imageMeta, error) {
	if ref == "" {
		return nil, fmt.Errorf("empty image reference: %w", errdefs.ErrInvalidArgument)
	}
	if meta, ok := s.images[ref]; ok {
		return meta, nil
	}
	if meta, ok := s.images["sha256:"+ref]; ok {
		return meta, nil
	}
	n, parseErr := ParseReference(ref)
	if parseErr == nil {
		for _, meta := range s.images {
			if n.Digest != "" {
				if slices.Contains(meta.RepoDigests, n.Repo()+"@"+n.Digest) {
					return meta, nil
				}
			} else if slices.Contains(meta.RepoTags, n.TagRef()) {
				return meta, nil
			}
		}
	}
	prefix := strings.TrimPrefix(ref, "sha256:")
	if hexPattern.MatchString(prefix) {
		meta, err := idprefix.Resolve(s.images, "image", prefix, func(id string) string { return strings.TrimPrefix(id, "sha256:") })
		if !errors.Is(err, errdefs.ErrNotFound) {
			return meta, err
		}
	}
	if parseErr != nil && !hexPattern.MatchString(prefix) {
		// Neither a name nor an ID: bad input, not a missing image.
		return nil, parseErr
	}
	return nil, fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
}

// Get returns the image ref names; errdefs.ErrNotFound when there is none.
func (s *Store) Get(ref string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	meta, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	return s.toImage(meta), nil
}

// List returns every image, ordered by ID.
func (s *Store) List() []*Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Image, 0, len(s.images))
	for _, meta := range s.images {
		out = append(out, s.toImage(meta))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// ConfigJSON is the image's config blob as stored.
func (s *Store) ConfigJSON(id string) ([]byte, error) {
	s.mu.Lock()
	meta, err := s.lookup(id)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(s.blobPath(meta.ConfigDigest))
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
	s.mu.Lock()
	defer s.mu.Unlock()
	meta, err := s.lookup(ref)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	p := s.path("records", strings.TrimPrefix(meta.ID, "sha256:")+".json")
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return false, fmt.Errorf("remove image metadata %s: %w", meta.ID, err)
	}
	delete(s.images, meta.ID)
	s.log.Info("image removed", "image", meta.ID, "tags", meta.RepoTags)
	s.gen++
	s.faults.Hit(fault.ImageMidRemove, "image", meta.ID)
	return true, nil
}

// Usage is what the store occupies on disk.
type Usage struct {
	Bytes  uint64
	Inodes uint64
}

// usageMaxAge bounds how stale a cached Usage may be when nothing changed
// through the store (kubelet asks every few seconds; walks cost O(files)).
const usageMaxAge = time.Minute

// Usage sums allocated bytes and inodes of the store (hard links counted
// once). The walk is cached until the store changes or usageMaxAge passes.
func (s *Store) Usage() (Usage, error) {
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	s.usageMu.Lock()
	defer s.usageMu.Unlock()
	if s.usageValid && s.usageGen == gen && time.Since(s.usageAt) < usageMaxAge {
		return s.usage, nil
	}
	u, err := s.walkUsage()
	if err != nil {
		return u, err
	}
	s.usage, s.usageGen, s.usageAt, s.usageValid = u, gen, time.Now(), true
	return u, nil
}

func (s *Store) walkUsage() (Usage, error) {
	trash := s.path("trash") // being deleted
	u, err := diskusage.Walk(s.dir, func(p string) bool { return p == trash })
	if err != nil {
		return Usage(u), fmt.Errorf("measure image store %s: %w", s.dir, err)
	}
	return Usage(u), nil
}

// copyFile is io.Copy with a context check between chunks.
func copyCtx(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, rerr := src.Read(buf)
		if m > 0 {
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
