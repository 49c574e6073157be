package bench

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"github.com/berthcri/berth/internal/testutil/testimages"
)

// The big image (issue 26): what users of CUDA and model images wait for.
// Bottom first: busybox (small), GOROOT copied bigFilesCopies times (many
// real files, ≥ 1 GiB), two model-weights-shaped files (2.75 GiB that
// barely compress), a small config layer. Generated deterministically
// once into the cache dir, in gzip and zstd, and served from those files.

const (
	bigImageVersion = "v2"
	bigFilesCopies  = 5 // 1.17 GiB of files
	// The weights: bf16-shaped words, the low byte random, the high byte
	// a random sign and one of 8 exponents. gzip and zstd at their
	// default levels store them as they are (99.9%): model weights barely
	// compress, these not at all.
	bigWeightsA = 1536 << 20
	bigWeightsB = 1280 << 20
)

// LayerBlob is one compressed layer blob on disk (the lazy image's
// eStargz blobs leave DiffID, Unpacked and MediaType empty).
type LayerBlob struct {
	Path      string `json:"path"`
	Digest    string `json:"digest"`
	DiffID    string `json:"diff_id"`
	Size      int64  `json:"size"`
	Unpacked  int64  `json:"unpacked"`
	MediaType string `json:"media_type"`
}

// BigImage is the big image in one compression.
type BigImage struct {
	Compression string     `json:"compression"`
	Layers      LayerBlobs `json:"layers"`
	Image       v1.Image   `json:"-"`
}

// Compressed and Unpacked are the sums over the layers.
func (b *BigImage) Compressed() (n int64) {
	for _, l := range b.Layers {
		n += l.Size
	}
	return n
}

func (b *BigImage) Unpacked() (n int64) {
	for _, l := range b.Layers {
		n += l.Unpacked
	}
	return n
}

// LayerBlobs are an image's layer blobs, bottom first.
type LayerBlobs []LayerBlob

// Files maps each layer digest to its blob file.
func (ls LayerBlobs) Files() map[string]string {
	m := map[string]string{}
	for _, l := range ls {
		m[l.Digest] = l.Path
	}
	return m
}

// BigImageCacheDir is $BENCH_CACHE or /var/tmp/berth-bench-cache.
func BigImageCacheDir() string {
	if d := os.Getenv("BENCH_CACHE"); d != "" {
		return d
	}
	return "/var/tmp/berth-bench-cache"
}

// BuildBigImages returns the gzip and zstd big images, generating their
// blobs under cacheDir the first time (a few minutes on two cores).
func BuildBigImages(cacheDir, goroot string) (gz, zst *BigImage, err error) {
	dir := filepath.Join(cacheDir, "bigimage-"+bigImageVersion)
	meta := filepath.Join(dir, "meta.json")
	var imgs []*BigImage
	if data, err := os.ReadFile(meta); err == nil && json.Unmarshal(data, &imgs) == nil && len(imgs) == 2 {
		for _, bi := range imgs {
			if bi.Image, err = bigV1Image(bi); err != nil {
				return nil, nil, err
			}
		}
		return imgs[0], imgs[1], nil
	}
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	gz, zst = &BigImage{Compression: "gzip"}, &BigImage{Compression: "zstd"}
	producers := []func(io.Writer) error{bigBase, bigFiles(goroot), bigWeights, bigConfig}
	gz.Layers = make([]LayerBlob, len(producers))
	zst.Layers = make([]LayerBlob, len(producers))
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, produce := range producers {
		g.Go(func() error {
			a, b, err := bigLayer(dir, i, produce)
			gz.Layers[i], zst.Layers[i] = a, b
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, fmt.Errorf("generate the big image: %w", err)
	}
	for _, bi := range []*BigImage{gz, zst} {
		if bi.Image, err = bigV1Image(bi); err != nil {
			return nil, nil, err
		}
	}
	data, err := json.Marshal([]*BigImage{gz, zst})
	if err != nil {
		return nil, nil, err
	}
	// Written last: a cache without it is generated again.
	return gz, zst, os.WriteFile(meta, data, 0o644)
}

// bigLayer writes one layer's tar (from produce) as a gzip and a zstd
// blob in one pass.
func bigLayer(dir string, i int, produce func(io.Writer) error) (gz, zst LayerBlob, err error) {
	type out struct {
		f  *os.File
		h  hash.Hash
		n  countWriter
		zw io.WriteCloser
	}
	var outs [2]*out
	for k, ext := range []string{"gz", "zst"} {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("layer%d.tar.%s", i, ext)))
		if err != nil {
			return gz, zst, err
		}
		defer f.Close()
		o := &out{f: f, h: sha256.New()}
		w := io.MultiWriter(f, o.h, &o.n)
		if ext == "gz" {
			o.zw = gzip.NewWriter(w)
		} else if o.zw, err = zstd.NewWriter(w); err != nil {
			return gz, zst, err
		}
		outs[k] = o
	}
	diff := sha256.New()
	var unpacked countWriter
	if err := produce(io.MultiWriter(diff, &unpacked, outs[0].zw, outs[1].zw)); err != nil {
		return gz, zst, err
	}
	var layers [2]LayerBlob
	for k, mt := range []types.MediaType{types.OCILayer, types.OCILayerZStd} {
		if err := outs[k].zw.Close(); err != nil {
			return gz, zst, err
		}
		layers[k] = LayerBlob{
			Path: outs[k].f.Name(), Digest: fmt.Sprintf("sha256:%x", outs[k].h.Sum(nil)),
			DiffID: fmt.Sprintf("sha256:%x", diff.Sum(nil)), Size: int64(outs[k].n), Unpacked: int64(unpacked),
			MediaType: string(mt),
		}
	}
	return layers[0], layers[1], nil
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

func bigBase(w io.Writer) error {
	files, err := testimages.BaseFiles()
	if err != nil {
		return err
	}
	l, err := testimages.Layer(files)
	if err != nil {
		return err
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.Copy(w, rc)
	return err
}

func bigConfig(w io.Writer) error {
	tw := tar.NewWriter(w)
	body := []byte(`{"model": "bench", "dtype": "bfloat16"}` + "\n")
	for _, h := range []*tar.Header{
		{Name: "models/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "models/config.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	if _, err := tw.Write(body); err != nil {
		return err
	}
	return tw.Close()
}

// bigWeights is two weights files of random bf16-shaped words.
func bigWeights(w io.Writer) error {
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: "models/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		return err
	}
	rng := rand.NewChaCha8([32]byte{'b', 'e', 'r', 't', 'h'})
	buf := make([]byte, 1<<20)
	for i, size := range []int64{bigWeightsA, bigWeightsB} {
		hdr := &tar.Header{Name: fmt.Sprintf("models/weights-%05d.safetensors", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		for left := size; left > 0; left -= int64(len(buf)) {
			_, _ = rng.Read(buf)
			for j := 1; j < len(buf); j += 2 {
				buf[j] = buf[j]&0x80 | 0x38 | buf[j]&0x07
			}
			if _, err := tw.Write(buf[:min(left, int64(len(buf)))]); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// bigFiles is GOROOT's files, bigFilesCopies times below usr/local/goN.
func bigFiles(goroot string) func(io.Writer) error {
	return func(w io.Writer) error {
		tw := tar.NewWriter(w)
		for c := 0; c < bigFilesCopies; c++ {
			prefix := fmt.Sprintf("usr/local/go%d/", c)
			err := filepath.WalkDir(goroot, func(p string, de fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				return tarEntry(tw, goroot, prefix, p, de, true)
			})
			if err != nil {
				return fmt.Errorf("tar %s: %w", goroot, err)
			}
		}
		return tw.Close()
	}
}

// tarEntry writes p (a file, directory or symlink below root; others
// are not image content) to tw as prefix + its path below root, owned by
// root, without access and change times; wholeSeconds drops the part of
// its mtime below a second (else a PAX record keeps it).
func tarEntry(tw *tar.Writer, root, prefix, p string, de fs.DirEntry, wholeSeconds bool) error {
	fi, err := de.Info()
	if err != nil {
		return err
	}
	mode := fi.Mode()
	if !mode.IsRegular() && !mode.IsDir() && mode&fs.ModeSymlink == 0 {
		return nil
	}
	var link string
	if mode&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return err
	}
	hdr.Name = prefix + filepath.ToSlash(rel)
	if mode.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
	hdr.Format = tar.FormatPAX
	if wholeSeconds {
		hdr.ModTime = time.Unix(fi.ModTime().Unix(), 0)
	}
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !mode.IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// bigV1Image is bi as a v1.Image (its layers' blobs are bi's files).
func bigV1Image(bi *BigImage) (v1.Image, error) {
	var adds []mutate.Addendum
	for _, l := range bi.Layers {
		d, err := v1.NewHash(l.Digest)
		if err != nil {
			return nil, err
		}
		diff, err := v1.NewHash(l.DiffID)
		if err != nil {
			return nil, err
		}
		fl := &fileLayer{path: l.Path, size: l.Size, digest: d, diffID: diff, mediaType: types.MediaType(l.MediaType)}
		adds = append(adds, mutate.Addendum{Layer: fl, MediaType: fl.mediaType})
	}
	return linuxImage(adds, func(cf *v1.ConfigFile) {
		cf.Created = v1.Time{}
		cf.Config.Env = []string{"PATH=/usr/local/go0/bin:/bin"}
	})
}

// fileLayer is a layer whose blob is a file and whose digests are known.
type fileLayer struct {
	path           string
	size           int64
	digest, diffID v1.Hash
	mediaType      types.MediaType
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return l.mediaType, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) {
	return nil, errors.New("bench: big layers are not decompressed here")
}
