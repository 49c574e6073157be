// Package estargzconv rewrites an image's layers into eStargz, the
// seekable gzip format lazy pulling reads (decision 3600): each layer a
// valid gzip tar whose last entry is a table of contents (TOC) with a
// digest per chunk, and whose manifest descriptor names the TOC's digest.
// The format itself is github.com/containerd/stargz-snapshotter/estargz's;
// this package only feeds it an image's layers and reassembles the image.
//
// berthctl's `image convert --estargz` and the test images both use it,
// so that what tests pull is what users make.
package estargzconv

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/stargz-snapshotter/estargz"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TOCDigestAnnotation is the layer descriptor annotation naming the
// digest of the layer's TOC JSON (containerd's stargz snapshotter, and
// what buildkit and nerdctl write).
const TOCDigestAnnotation = estargz.TOCJSONDigestAnnotation

// DefaultMaxLayerSize bounds one layer's uncompressed tar: the default of
// berthd's image_limits.max_layer_size, which a pull of the result would
// refuse above anyway.
const DefaultMaxLayerSize = 32 << 30

// ErrLayerTooLarge is a layer whose tar is over Options.MaxLayerSize.
var ErrLayerTooLarge = errors.New("layer over the size limit")

// Options shape a conversion.
type Options struct {
	// Prioritized are the files (absolute or relative to /) read first
	// when the image starts: they are placed at the front of their
	// layer, before the prefetch landmark, so that a lazy pull fetches
	// them before it returns.
	Prioritized []string
	// ChunkSize is the largest chunk of a file the TOC digests apart
	// (0: the format's default, 4 MiB). A lazy read fetches whole chunks.
	ChunkSize int
	// CompressionLevel is gzip's (0: gzip.DefaultCompression).
	CompressionLevel int
	// MaxLayerSize bounds each layer's uncompressed tar in bytes (0:
	// DefaultMaxLayerSize): the source may be anyone's image, and its
	// layers are written out whole to TempDir.
	MaxLayerSize int64
	// TempDir holds the converted layers until the image is written
	// somewhere; the caller removes it after that. Required.
	TempDir string
}

// Result is a converted image.
type Result struct {
	Image v1.Image
	// MissedPrioritized are the Prioritized files found in no layer.
	MissedPrioritized []string
}

// Convert rewrites img's layers into eStargz. Layers that already carry a
// TOC digest are kept as they are. The result is an OCI image (layer
// annotations need an OCI manifest) with img's config, history included,
// and the new layers' diff IDs.
func Convert(ctx context.Context, img v1.Image, opts Options) (*Result, error) {
	if opts.TempDir == "" {
		return nil, errors.New("convert to eStargz: no temporary directory")
	}
	if opts.MaxLayerSize <= 0 {
		opts.MaxLayerSize = DefaultMaxLayerSize
	}
	if opts.CompressionLevel == 0 {
		opts.CompressionLevel = gzip.DefaultCompression
	}
	mf, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("convert to eStargz: read manifest: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("convert to eStargz: read config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("convert to eStargz: list layers: %w", err)
	}
	if len(layers) != len(mf.Layers) {
		return nil, fmt.Errorf("convert to eStargz: the manifest lists %d layers, the image %d", len(mf.Layers), len(layers))
	}
	// Prioritized files found in some layer, to report the others.
	found := map[string]bool{}
	out := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	out = mutate.ConfigMediaType(out, types.OCIConfigJSON)
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if d := mf.Layers[i].Annotations[TOCDigestAnnotation]; d != "" {
			if out, err = mutate.Append(out, mutate.Addendum{Layer: l, Annotations: map[string]string{TOCDigestAnnotation: d}, MediaType: types.OCILayer}); err != nil {
				return nil, fmt.Errorf("convert to eStargz: layer %d: %w", i, err)
			}
			continue
		}
		cl, missed, err := convertLayer(ctx, l, i, opts)
		if err != nil {
			return nil, err
		}
		for _, p := range opts.Prioritized {
			if !slices.Contains(missed, p) {
				found[p] = true
			}
		}
		if out, err = mutate.Append(out, mutate.Addendum{
			Layer:       cl,
			Annotations: map[string]string{TOCDigestAnnotation: cl.toc},
			MediaType:   types.OCILayer,
		}); err != nil {
			return nil, fmt.Errorf("convert to eStargz: layer %d: %w", i, err)
		}
	}
	// The source's config, with the new layers' diff IDs: mutate.Append
	// set those, and added history entries that the source's replace.
	ncf, err := out.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("convert to eStargz: %w", err)
	}
	cf = cf.DeepCopy()
	cf.RootFS = ncf.RootFS
	if out, err = mutate.ConfigFile(out, cf); err != nil {
		return nil, fmt.Errorf("convert to eStargz: config: %w", err)
	}
	res := &Result{Image: out}
	for _, p := range opts.Prioritized {
		if !found[p] {
			res.MissedPrioritized = append(res.MissedPrioritized, p)
		}
	}
	return res, nil
}

// convertLayer writes layer i's tar to a file in opts.TempDir (bounded),
// builds its eStargz blob into another, and returns it as a layer with
// the prioritized files that it does not hold.
func convertLayer(ctx context.Context, l v1.Layer, i int, opts Options) (*fileLayer, []string, error) {
	tarPath := filepath.Join(opts.TempDir, fmt.Sprintf("layer-%d.tar", i))
	if err := writeTar(l, tarPath, opts.MaxLayerSize); err != nil {
		return nil, nil, fmt.Errorf("convert to eStargz: layer %d: %w", i, err)
	}
	defer os.Remove(tarPath)
	tf, err := os.Open(tarPath)
	if err != nil {
		return nil, nil, err
	}
	defer tf.Close()
	fi, err := tf.Stat()
	if err != nil {
		return nil, nil, err
	}
	missed := []string{}
	buildOpts := []estargz.Option{
		estargz.WithContext(ctx),
		estargz.WithCompressionLevel(opts.CompressionLevel),
		estargz.WithPrioritizedFiles(opts.Prioritized),
		estargz.WithAllowPrioritizeNotFound(&missed),
	}
	if opts.ChunkSize > 0 {
		buildOpts = append(buildOpts, estargz.WithChunkSize(opts.ChunkSize))
	}
	blob, err := estargz.Build(io.NewSectionReader(tf, 0, fi.Size()), buildOpts...)
	if err != nil {
		return nil, nil, fmt.Errorf("convert to eStargz: layer %d: %w", i, err)
	}
	fl, err := writeBlob(blob, filepath.Join(opts.TempDir, fmt.Sprintf("layer-%d.esgz", i)))
	if err != nil {
		return nil, nil, fmt.Errorf("convert to eStargz: layer %d: %w", i, err)
	}
	return fl, missed, nil
}

// writeTar copies l's uncompressed tar to path, refusing more than max
// bytes.
func writeTar(l v1.Layer, path string, max int64) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	defer rc.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(rc, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > max {
		err = fmt.Errorf("%w: more than %d bytes uncompressed", ErrLayerTooLarge, max)
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("write tar: %w", err)
	}
	return nil
}

// writeBlob stores blob at path, hashing it on the way.
func writeBlob(blob *estargz.Blob, path string) (*fileLayer, error) {
	defer blob.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), blob)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The diff ID is known once the blob was read to its end.
		err = blob.Close()
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("write eStargz blob: %w", err)
	}
	diffID, err := v1.NewHash(blob.DiffID().String())
	if err != nil {
		return nil, err
	}
	return &fileLayer{
		path:   path,
		size:   n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))},
		diffID: diffID,
		toc:    blob.TOCDigest().String(),
	}, nil
}

// fileLayer is a converted layer in a file, with the digests computed as
// it was written (go-containerregistry would otherwise read it again for
// each).
type fileLayer struct {
	path   string
	size   int64
	digest v1.Hash
	diffID v1.Hash
	toc    string
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return types.OCILayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return gunzipFile(l.path) }

// gunzipFile reads the gzip file at path decompressed.
func gunzipFile(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &gunzipReader{Reader: zr, f: f}, nil
}

type gunzipReader struct {
	*gzip.Reader
	f *os.File
}

func (r *gunzipReader) Close() error {
	r.Reader.Close()
	return r.f.Close()
}
