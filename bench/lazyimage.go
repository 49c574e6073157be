package bench

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/image/estargzconv"
)

// The lazy-pull image (issue 36): a model-weights-shaped file that
// barely compresses plus a real file tree (the Go toolchain's bin and
// pkg/tool), over busybox, every layer eStargz with the files the
// container starts with prioritised, made by estargzconv as `berthctl
// image convert --estargz` makes it. Generated once per weights size
// into the cache dir (an OCI layout, its blobs served from their files).

const lazyImageVersion = "v1"

// Paths inside the lazy image.
const (
	lazyWeightsPath = "models/weights.safetensors"
	lazyProgram     = "usr/local/go/bin/gofmt"
)

// lazyPrioritized are the files the container reads first, in order:
// its shell and the program it runs. The weights are read on demand.
var lazyPrioritized = []string{"bin/busybox", lazyProgram}

// LazyImage is the lazy-pull image as stored in its cache.
type LazyImage struct {
	Image v1.Image
	// WeightsBytes is the weights file's size.
	WeightsBytes int64
	// Layers are the blobs, bottom first: digest and file.
	Layers LayerBlobs
	// Compressed is the sum of the blobs' sizes, Unpacked of their tars.
	Compressed, Unpacked int64
}

type lazyMeta struct {
	Manifest string `json:"manifest"`
	Unpacked int64  `json:"unpacked"`
}

// BuildLazyImage returns the lazy image with weightsMB MiB of weights,
// converting it under cacheDir the first time (minutes at the issue's
// 3 GiB on two cores: estargz compresses every byte with gzip).
func BuildLazyImage(ctx context.Context, cacheDir, goroot string, weightsMB int) (*LazyImage, error) {
	dir := filepath.Join(cacheDir, fmt.Sprintf("lazyimage-%s-%dm", lazyImageVersion, weightsMB))
	metaPath := filepath.Join(dir, "meta.json")
	var meta lazyMeta
	if data, err := os.ReadFile(metaPath); err != nil || json.Unmarshal(data, &meta) != nil {
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if meta, err = convertLazyImage(ctx, dir, goroot, int64(weightsMB)<<20); err != nil {
			return nil, fmt.Errorf("generate the lazy-pull image: %w", err)
		}
		data, err := json.Marshal(meta)
		if err != nil {
			return nil, err
		}
		// Written last: a cache without it is generated again.
		if err := os.WriteFile(metaPath, data, 0o644); err != nil {
			return nil, err
		}
	}
	return loadLazyImage(filepath.Join(dir, "layout"), meta, int64(weightsMB)<<20)
}

// convertLazyImage builds the source image (uncompressed layers streamed
// from their producers), converts it to eStargz and writes it as an OCI
// layout under dir.
func convertLazyImage(ctx context.Context, dir, goroot string, weights int64) (lazyMeta, error) {
	producers := []func(io.Writer) error{bigBase, lazyTree(goroot), lazyWeights(weights)}
	var adds []mutate.Addendum
	var unpacked int64
	for _, p := range producers {
		l, err := newStreamLayer(p)
		if err != nil {
			return lazyMeta{}, err
		}
		unpacked += l.size
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: types.OCIUncompressedLayer})
	}
	src, err := linuxImage(adds, func(cf *v1.ConfigFile) {
		cf.Created = v1.Time{}
		cf.Config.Env = []string{"PATH=/usr/local/go/bin:/bin"}
	})
	if err != nil {
		return lazyMeta{}, err
	}
	tmp := filepath.Join(dir, "convert")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return lazyMeta{}, err
	}
	defer os.RemoveAll(tmp)
	res, err := estargzconv.Convert(ctx, src, estargzconv.Options{Prioritized: lazyPrioritized, TempDir: tmp})
	if err != nil {
		return lazyMeta{}, err
	}
	if len(res.MissedPrioritized) > 0 {
		return lazyMeta{}, fmt.Errorf("prioritized files in no layer: %q", res.MissedPrioritized)
	}
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		return lazyMeta{}, err
	}
	if err := p.AppendImage(res.Image); err != nil {
		return lazyMeta{}, err
	}
	d, err := res.Image.Digest()
	if err != nil {
		return lazyMeta{}, err
	}
	return lazyMeta{Manifest: d.String(), Unpacked: unpacked}, nil
}

// loadLazyImage reads the converted image back from its layout.
func loadLazyImage(dir string, meta lazyMeta, weights int64) (*LazyImage, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	h, err := v1.NewHash(meta.Manifest)
	if err != nil {
		return nil, err
	}
	img, err := p.Image(h)
	if err != nil {
		return nil, fmt.Errorf("read the lazy-pull image from %s: %w", dir, err)
	}
	mf, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	li := &LazyImage{Image: img, WeightsBytes: weights, Unpacked: meta.Unpacked}
	for _, l := range mf.Layers {
		if l.Annotations[estargzconv.TOCDigestAnnotation] == "" {
			return nil, fmt.Errorf("lazy-pull image layer %s has no TOC digest", l.Digest)
		}
		li.Layers = append(li.Layers, LayerBlob{Digest: l.Digest.String(), Path: filepath.Join(dir, "blobs", l.Digest.Algorithm, l.Digest.Hex), Size: l.Size})
		li.Compressed += l.Size
	}
	return li, nil
}

// lazyTree is the Go toolchain's bin and pkg/tool below usr/local/go/:
// real executables, one of which the container runs.
func lazyTree(goroot string) func(io.Writer) error {
	return func(w io.Writer) error {
		tw := tar.NewWriter(w)
		// Parents first, as a tar of the whole tree would have them.
		for _, d := range []string{"usr/", "usr/local/", "usr/local/go/", "usr/local/go/pkg/"} {
			if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				return err
			}
		}
		for _, sub := range []string{"bin", "pkg/tool"} {
			base := filepath.Join(goroot, sub)
			err := filepath.WalkDir(base, func(p string, de fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				return tarEntry(tw, goroot, "usr/local/go/", p, de, true)
			})
			if err != nil {
				return fmt.Errorf("tar %s: %w", base, err)
			}
		}
		return tw.Close()
	}
}

// lazyWeights is one weights file of size bytes, shaped as bigWeights'.
func lazyWeights(size int64) func(io.Writer) error {
	return func(w io.Writer) error {
		tw := tar.NewWriter(w)
		if err := tw.WriteHeader(&tar.Header{Name: "models/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: lazyWeightsPath, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
			return err
		}
		rng := rand.NewChaCha8([32]byte{'l', 'a', 'z', 'y'})
		buf := make([]byte, 1<<20)
		for left := size; left > 0; left -= int64(len(buf)) {
			_, _ = rng.Read(buf)
			for j := 1; j < len(buf); j += 2 {
				buf[j] = buf[j]&0x80 | 0x38 | buf[j]&0x07
			}
			if _, err := tw.Write(buf[:min(left, int64(len(buf)))]); err != nil {
				return err
			}
		}
		return tw.Close()
	}
}

// streamLayer is an uncompressed layer produced on demand: its blob is
// its tar, so its digest is its diff ID, computed once by producing it.
// It only feeds estargzconv, which reads each tar once more.
type streamLayer struct {
	produce func(io.Writer) error
	digest  v1.Hash
	size    int64
}

func newStreamLayer(produce func(io.Writer) error) (*streamLayer, error) {
	h := sha256.New()
	var n countWriter
	if err := produce(io.MultiWriter(h, &n)); err != nil {
		return nil, err
	}
	return &streamLayer{produce: produce, digest: v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}, size: int64(n)}, nil
}

func (l *streamLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *streamLayer) DiffID() (v1.Hash, error)            { return l.digest, nil }
func (l *streamLayer) Size() (int64, error)                { return l.size, nil }
func (l *streamLayer) MediaType() (types.MediaType, error) { return types.OCIUncompressedLayer, nil }
func (l *streamLayer) Compressed() (io.ReadCloser, error)  { return l.Uncompressed() }
func (l *streamLayer) Uncompressed() (io.ReadCloser, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(l.produce(pw)) }()
	return pr, nil
}

// lazyReadPaths are the files the container reads at start, as paths in
// the image (no leading slash), with how many bytes of each (0: all).
func lazyReadPaths(readBytes int64) map[string]int64 {
	m := map[string]int64{lazyWeightsPath: readBytes}
	for _, p := range lazyPrioritized {
		m[strings.TrimPrefix(p, "/")] = 0
	}
	return m
}
