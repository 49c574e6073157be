package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/tracing"
)

// Storing an image, for pulls and imports alike: its manifest and config
// into the content store, each layer fetched (fetch.go) and unpacked
// (unpack.go) into the layer store, one syncfs, and the record into the
// index last.

// Limits on what is read whole into memory (decision 3420). A manifest or
// index: 4 MiB, what the OCI distribution spec asks registries to accept
// at least (go-containerregistry itself stops at 100 MiB). A config, or an
// import's manifest.json or index.json: 20 MiB, containerd's limit for the
// JSON files of an import since CVE-2023-25153.
const (
	maxManifestSize = 4 << 20
	maxConfigSize   = 20 << 20
)

// layerParallelism is how many layers of one image download and unpack at
// once: enough to overlap one layer's network waits with another's
// decompression on a small node, few enough not to thrash its disk.
const layerParallelism = 3

// blobOpener starts reading a layer's compressed blob: a registry
// (registryBlobs, which can also open a byte range: rangeOpener) or an
// import's archive (openFunc).
type blobOpener interface {
	open(ctx context.Context, lr layerMeta) (io.ReadCloser, error)
}

// openFunc is a blobOpener that reads whole blobs only.
type openFunc func(ctx context.Context, lr layerMeta) (io.ReadCloser, error)

func (f openFunc) open(ctx context.Context, lr layerMeta) (io.ReadCloser, error) { return f(ctx, lr) }

// rangeOpener is a blobOpener that can also open the bytes [start, end)
// of a blob. partial is false when the registry answered with the whole
// blob (200) instead of the range; the body is then the whole blob.
type rangeOpener interface {
	blobOpener
	openRange(ctx context.Context, lr layerMeta, start, end int64) (body io.ReadCloser, partial bool, err error)
	// ranges is how this source fetches large blobs in ranges.
	ranges() RangeFetch
}

// described is an image as its manifest and config describe it, checked,
// before anything of it is stored.
type described struct {
	rec      *imageMeta
	manifest []byte
	config   []byte
	layers   []v1.Layer
}

// keys are the digests and chain IDs the image's pull works on.
func (d *described) keys() []string {
	keys := []string{d.rec.ManifestDigest, d.rec.ConfigDigest}
	for _, l := range d.rec.Layers {
		keys = append(keys, l.Digest, l.ChainID)
	}
	return keys
}

// commit stores img's blobs and layers and then its metadata under names
// (repo:tag and repo@digest strings). Used by pulls and imports: open
// fetches a layer blob (nil: img's own layers). w, if set, hears about
// progress.
func (s *Store) commit(ctx context.Context, img v1.Image, names []string, open blobOpener, w *pullWatch) (*Image, error) {
	d, err := describe(img)
	if err != nil {
		return nil, err
	}
	rec := d.rec
	// Keep GC (a concurrent RemoveImage) off what this pull is writing.
	keys := d.keys()
	s.refs.mark(keys, 1)
	defer s.refs.mark(keys, -1)

	if err := s.content.writeBlob(rec.ManifestDigest, d.manifest); err != nil {
		return nil, err
	}
	s.faults.Hit(fault.ImageAfterBlobWrite, "image", rec.ConfigDigest)
	if err := s.content.writeBlob(rec.ConfigDigest, d.config); err != nil {
		return nil, err
	}
	limits := s.settings().Limits
	for _, lr := range rec.Layers {
		if !types.MediaType(lr.MediaType).IsDistributable() {
			return nil, fmt.Errorf("layer %s is non-distributable: %w", lr.Digest, errdefs.ErrFailedPrecondition)
		}
		if max := limits.MaxLayerSize; max > 0 && lr.Size > max+max/64+1<<20 {
			// gzip and zstd grow incompressible data by far less than
			// 1/64: this blob cannot unpack within the limit.
			return nil, fmt.Errorf("layer %s: blob of %d bytes, over the limit image_limits.max_layer_size (%d bytes unpacked): %w", lr.Digest, lr.Size, max, errdefs.ErrResourceExhausted)
		}
	}
	chains := make([]string, len(rec.Layers))
	for i, lr := range rec.Layers {
		chains[i] = lr.ChainID
	}
	w.waitFor(chains)
	if open == nil {
		open = imageLayers(d.layers)
	}
	opts := UnpackOptions{
		MaxLayerSize: limits.MaxLayerSize, MaxEntries: limits.MaxLayerEntries, MaxDirs: limits.MaxLayerDirs,
		Image: NewSizeBudget(limits.MaxImageSize), Log: s.log,
	}
	if err := s.storeLayers(ctx, rec.Layers, open, opts); err != nil {
		return nil, err
	}
	// One flush of the filesystem makes every blob and layer file this
	// pull wrote durable before the record that makes them an image
	// (decision 1510): no fsync per file or blob on the way.
	synced := time.Now()
	if err := s.content.sync(); err != nil {
		return nil, err
	}
	s.log.Debug("image store synced", "image", rec.ID, "took", time.Since(synced))
	return s.index.register(rec, names)
}

// describe reads and checks img's manifest, config and layer list: a
// linux image whose layers match its config's diff IDs, every digest
// well-formed (they name files and dirs in the store).
func describe(img v1.Image) (*described, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, classify(fmt.Errorf("read manifest: %w", err))
	}
	if len(manifest) > maxManifestSize {
		return nil, fmt.Errorf("manifest of %d bytes, over the limit of %d: %w", len(manifest), maxManifestSize, errdefs.ErrResourceExhausted)
	}
	mdigest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("manifest digest: %w", err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, classify(fmt.Errorf("parse manifest: %w", err))
	}
	// The config is read whole into memory before its digest can be
	// checked: its declared size must be sane before one byte is read
	// (CVE-2023-25153's class).
	if m.Config.Size < 0 || m.Config.Size > maxConfigSize {
		return nil, fmt.Errorf("image config %s declares %d bytes, over the limit of %d: %w", m.Config.Digest, m.Config.Size, maxConfigSize, errdefs.ErrResourceExhausted)
	}
	cfgRaw, err := img.RawConfigFile()
	if err != nil {
		return nil, classify(fmt.Errorf("read config: %w", err))
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("config digest: %w", err)
	}
	var cfg ocispecv1.Image
	if err := json.Unmarshal(cfgRaw, &cfg); err != nil {
		return nil, fmt.Errorf("parse image config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, fmt.Errorf("image is for %s, not linux: %w", cfg.OS, errdefs.ErrFailedPrecondition)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, classify(fmt.Errorf("read layers: %w", err))
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return nil, fmt.Errorf("image has %d layers but its config %d diff IDs: %w", len(layers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	rec := &imageMeta{ID: cdigest.String(), ManifestDigest: mdigest.String(), ConfigDigest: cdigest.String(), config: &cfg}
	rec.Size = uint64(len(cfgRaw))
	diffIDs := make([]string, len(cfg.RootFS.DiffIDs))
	for i, d := range cfg.RootFS.DiffIDs {
		diffIDs[i] = d.String()
	}
	if rec.Layers, err = describeLayers(layers, diffIDs); err != nil {
		return nil, err
	}
	if len(m.Layers) == len(rec.Layers) {
		for i, l := range m.Layers {
			if d := l.Annotations[lazy.TOCDigestAnnotation]; digestPattern.MatchString(d) {
				rec.Layers[i].TOCDigest = d
			}
		}
	}
	for _, l := range rec.Layers {
		rec.Size += uint64(l.Size)
	}
	return &described{rec: rec, manifest: manifest, config: cfgRaw, layers: layers}, nil
}

// describeLayers is each layer's digest, size, media type, diff ID and
// chain ID, bottom layer first.
func describeLayers(layers []v1.Layer, diffIDs []string) ([]layerMeta, error) {
	var out []layerMeta
	var chain string
	for i, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, classify(fmt.Errorf("layer %d digest: %w", i, err))
		}
		size, err := l.Size()
		if err != nil {
			return nil, classify(fmt.Errorf("layer %s size: %w", d, err))
		}
		mt, err := l.MediaType()
		if err != nil {
			return nil, fmt.Errorf("layer %s media type: %w", d, err)
		}
		diffID := diffIDs[i]
		// Digests name files and dirs in the store: only well-formed ones.
		if !digestPattern.MatchString(diffID) || !digestPattern.MatchString(d.String()) {
			return nil, fmt.Errorf("layer %d: digest %q / diff ID %q is not sha256:<64 hex>: %w", i, d, diffID, errdefs.ErrInvalidArgument)
		}
		if i == 0 {
			chain = diffID
		} else {
			sum := sha256.Sum256([]byte(chain + " " + diffID))
			chain = "sha256:" + hex.EncodeToString(sum[:])
		}
		out = append(out, layerMeta{Digest: d.String(), MediaType: string(mt), Size: size, DiffID: diffID, ChainID: chain})
	}
	return out, nil
}

// imageLayers opens the layers of an image at hand (an import's archive).
func imageLayers(layers []v1.Layer) blobOpener {
	return openFunc(func(ctx context.Context, lr layerMeta) (io.ReadCloser, error) {
		for _, l := range layers {
			if d, err := l.Digest(); err == nil && d.String() == lr.Digest {
				return l.Compressed()
			}
		}
		return nil, fmt.Errorf("layer %s: not in the image: %w", lr.Digest, errdefs.ErrNotFound)
	})
}

// storeLayers makes every layer present, a few at a time: each layer
// unpacks into its own dir, so layers stream in parallel. As each layer is
// in place its files start going to disk while the others still unpack,
// so the caller's syncfs waits for little.
func (s *Store) storeLayers(ctx context.Context, layers []layerMeta, open blobOpener, opts UnpackOptions) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(layerParallelism)
	var early sync.WaitGroup
	var earlyRunning atomic.Bool
	defer early.Wait()
	for _, lr := range layers {
		g.Go(func() error {
			if err := s.ensureLayer(gctx, lr, open, opts); err != nil {
				return err
			}
			if earlyRunning.CompareAndSwap(false, true) {
				early.Add(1)
				go func() {
					defer early.Done()
					defer earlyRunning.Store(false)
					_ = s.content.sync() // a head start only; the caller's counts
				}()
			}
			return nil
		})
	}
	return g.Wait()
}

// ensureLayer makes layer lr present, its blob in blobs/ and its unpacked
// dir in layers/, once per chain ID however many pulls need it at once.
func (s *Store) ensureLayer(ctx context.Context, lr layerMeta, open blobOpener, opts UnpackOptions) error {
	for attempt := 0; ; attempt++ {
		err := s.fetchLayer(ctx, lr, open, opts)
		// A shared stream started by a pull whose callers all left is
		// cancelled; a caller still waiting streams it again itself.
		if err != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil && attempt == 0 {
			continue
		}
		return err
	}
}

func (s *Store) layerPresent(lr layerMeta) bool {
	return s.layers.has(lr.ChainID) && (s.content.has(lr.Digest) || s.lazy.get(lr.ChainID))
}

func (s *Store) fetchLayer(ctx context.Context, lr layerMeta, open blobOpener, opts UnpackOptions) (err error) {
	if s.layerPresent(lr) {
		return nil
	}
	ctx, span := tracing.Start(ctx, "image.layer.fetch", tracing.AttrLayer.String(lr.Digest))
	defer func() { tracing.End(span, err) }()
	_, err = s.layerFetches.Do(ctx, lr.ChainID, func(ctx context.Context) (struct{}, error) {
		if s.layerPresent(lr) {
			return struct{}{}, nil
		}
		if rb, ok := open.(registryBlobs); ok && rb.lazy && lr.TOCDigest != "" && !s.layers.has(lr.ChainID) && !s.content.has(lr.Digest) {
			err := s.lazyLayer(ctx, lr, rb)
			if !errors.Is(err, errNotLazy) {
				return struct{}{}, err
			}
			s.log.Info("layer pulled whole", "layer", lr.Digest, "reason", err)
		}
		err := s.streamLayer(ctx, lr, open, opts)
		if err == nil && ctx.Err() != nil {
			// Every pull that wanted the layer left (one failed) while it
			// was being stored: nothing will record it, collect it.
			s.requestGC()
		}
		return struct{}{}, err
	})
	return err
}

// streamLayer reads lr's blob once, as it arrives: its bytes are hashed
// and written to a blob file in ingest/ (blobFetch) while they are
// decompressed, hashed again and unpacked into a layer dir in ingest/
// (unpackLayer). Only when both digests match (blob digest and diff ID)
// and the blob had its announced size do the two move into blobs/ and
// layers/; any failure, a digest mismatch included, removes what the
// stream wrote. A blob already stored is unpacked from disk; a layer
// already unpacked only has its blob fetched.
func (s *Store) streamLayer(ctx context.Context, lr layerMeta, open blobOpener, opts UnpackOptions) error {
	count, stopCount := s.streams.start(lr.ChainID)
	defer stopCount()
	bf, err := s.startBlobFetch(ctx, lr, open, count)
	if err != nil {
		return err
	}
	defer bf.close()
	var tx *layerTx
	if !s.layers.has(lr.ChainID) {
		if tx, err = s.layers.prepare(lr.ChainID); err != nil {
			return err
		}
		defer tx.abort()
		_, span := tracing.Start(ctx, "image.layer.unpack", tracing.AttrLayer.String(lr.Digest))
		err = unpackLayer(ctx, bf, lr, tx.diffDir(), opts)
		tracing.End(span, err)
	}
	if err := bf.finish(err); err != nil {
		return err
	}
	if tx != nil {
		if err := tx.commit(); err != nil {
			return err
		}
		s.faults.Hit(fault.ImageMidUnpack, "layer", lr.ChainID)
	}
	return nil
}
