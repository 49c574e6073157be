package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/idprefix"
)

const metaVersion = 1

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
	// TOCDigest is the manifest's eStargz TOC digest annotation: the
	// layer can be served lazily (decision 3600).
	TOCDigest string `json:"tocDigest,omitempty"`
}

// imageIndex is the image metadata: one record per image, with its names
// (repo:tag, repo@digest), manifest, config and layers, and the lookups by
// ID, ID prefix, tag and digest. An image exists once its record is
// written, which a pull does last. It is containerd's image store (the
// metadata, not the content).
//
// Lock order: mu before references.mu (the collector and Acquire hold
// both).
type imageIndex struct {
	dir     string // records/
	content *contentStore
	layers  *layerStore
	pinned  []string // references reported pinned
	changed func()   // told of each change to the records (the usage cache)

	// mu guards images and the record files: each is written or removed
	// under it, and read without it only at load.
	mu     sync.Mutex
	images map[string]*imageMeta // by ID
	// lazyOnDisk, if set, is the bytes on disk of a lazy layer that is
	// not complete yet (ok false for any other layer).
	lazyOnDisk func(chainID string) (n int64, ok bool)
}

func (x *imageIndex) recordPath(id string) string {
	return filepath.Join(x.dir, strings.TrimPrefix(id, "sha256:")+".json")
}

// load reads records/ (Open), dropping what cannot be read: temp files of
// interrupted writes and records whose config or layers are gone.
func (x *imageIndex) load(log *slog.Logger) error {
	entries, err := os.ReadDir(x.dir)
	if err != nil {
		return fmt.Errorf("read image metadata: %w", err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range entries {
		p := filepath.Join(x.dir, e.Name())
		if !strings.HasSuffix(e.Name(), ".json") {
			os.Remove(p) // a temp file from an interrupted write
			continue
		}
		meta, err := x.loadMeta(p)
		if err != nil {
			log.Warn("dropping unreadable image metadata", "path", p, "error", err)
			os.Remove(p)
			continue
		}
		x.images[meta.ID] = meta
	}
	return nil
}

func (x *imageIndex) loadMeta(p string) (*imageMeta, error) {
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
	cfgData, err := x.content.read(meta.ConfigDigest)
	if err != nil {
		return nil, fmt.Errorf("config blob: %w", err)
	}
	var cfg ocispecv1.Image
	if err := json.Unmarshal(cfgData, &cfg); err != nil {
		return nil, fmt.Errorf("config blob: %w", err)
	}
	meta.config = &cfg
	for _, l := range meta.Layers {
		if _, err := os.Stat(x.layers.diffDir(l.ChainID)); err != nil {
			return nil, fmt.Errorf("layer %s: %w", l.ChainID, err)
		}
	}
	return &meta, nil
}

// writeMeta persists meta. Caller holds x.mu.
func (x *imageIndex) writeMeta(meta *imageMeta) error {
	x.changed()
	meta.Version = metaVersion
	data, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(x.recordPath(meta.ID), data, 0o600)
}

func (x *imageIndex) toImage(meta *imageMeta) *Image {
	img := &Image{
		ID:          meta.ID,
		RepoTags:    slices.Clone(meta.RepoTags),
		RepoDigests: slices.Clone(meta.RepoDigests),
		Size:        meta.Size,
		Config:      meta.config,
	}
	for _, l := range meta.Layers {
		img.ChainIDs = append(img.ChainIDs, l.ChainID)
		// A lazy layer not yet complete counts what it has on disk.
		if x.lazyOnDisk != nil {
			if n, ok := x.lazyOnDisk(l.ChainID); ok && uint64(l.Size) <= img.Size {
				img.Size = img.Size - uint64(l.Size) + uint64(n)
			}
		}
	}
	for _, p := range x.pinned {
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
// name@digest (short names normalized). Caller holds x.mu.
func (x *imageIndex) lookup(ref string) (*imageMeta, error) {
	if ref == "" {
		return nil, fmt.Errorf("empty image reference: %w", errdefs.ErrInvalidArgument)
	}
	if meta, ok := x.images[ref]; ok {
		return meta, nil
	}
	if meta, ok := x.images["sha256:"+ref]; ok {
		return meta, nil
	}
	n, parseErr := ParseReference(ref)
	if parseErr == nil {
		for _, meta := range x.images {
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
		meta, err := idprefix.Resolve(x.images, "image", prefix, func(id string) string { return strings.TrimPrefix(id, "sha256:") })
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

// withImage calls fn with the image ref names, holding x.mu: what fn does
// (take a lease, mark blobs in use) happens before any removal of it.
func (x *imageIndex) withImage(ref string, fn func(meta *imageMeta) error) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	meta, err := x.lookup(ref)
	if err != nil {
		return err
	}
	return fn(meta)
}

// get returns the image ref names.
func (x *imageIndex) get(ref string) (*Image, error) {
	var img *Image
	err := x.withImage(ref, func(meta *imageMeta) error {
		img = x.toImage(meta)
		return nil
	})
	return img, err
}

// list returns every image, ordered by ID.
func (x *imageIndex) list() []*Image {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]*Image, 0, len(x.images))
	for _, meta := range x.images {
		out = append(out, x.toImage(meta))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// view calls fn with the images, holding x.mu (the collector's decision).
func (x *imageIndex) view(fn func(images map[string]*imageMeta)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	fn(x.images)
}

// register writes rec with names added, moving tags other images held.
func (x *imageIndex) register(rec *imageMeta, names []string) (*Image, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if old, ok := x.images[rec.ID]; ok {
		rec.RepoTags = slices.Clone(old.RepoTags)
		rec.RepoDigests = slices.Clone(old.RepoDigests)
		rec.ManifestDigest, rec.Layers = old.ManifestDigest, old.Layers
	}
	var tags []string
	for _, nm := range names {
		if strings.Contains(nm, "@") {
			if !slices.Contains(rec.RepoDigests, nm) {
				rec.RepoDigests = append(rec.RepoDigests, nm)
			}
		} else {
			tags = append(tags, nm)
			if !slices.Contains(rec.RepoTags, nm) {
				rec.RepoTags = append(rec.RepoTags, nm)
			}
		}
	}
	if err := x.writeMeta(rec); err != nil {
		return nil, fmt.Errorf("write image metadata %s: %w", rec.ID, err)
	}
	x.images[rec.ID] = rec
	for id, other := range x.images {
		if id == rec.ID {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(other.RepoTags), func(t string) bool { return slices.Contains(tags, t) })
		if len(kept) != len(other.RepoTags) {
			other.RepoTags = kept
			if err := x.writeMeta(other); err != nil {
				return nil, fmt.Errorf("untag image %s: %w", other.ID, err)
			}
		}
	}
	return x.toImage(rec), nil
}

// remove forgets the image ref names and calls removed, still under x.mu,
// with it (the fault point of crash tests); nil, nil when there was none.
func (x *imageIndex) remove(ref string, removed func(meta *imageMeta)) (*imageMeta, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	meta, err := x.lookup(ref)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := os.Remove(x.recordPath(meta.ID)); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove image metadata %s: %w", meta.ID, err)
	}
	delete(x.images, meta.ID)
	x.changed()
	removed(meta)
	return meta, nil
}
