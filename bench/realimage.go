package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"github.com/berthcri/berth/internal/image"
)

// RealLayerDirs are the directories of the Go toolchain (GOROOT) that
// become the real-size image's layers, bottom first: every machine that
// builds berth has them. src is the layer of many small files (about 11k),
// pkg the one of a few large binaries.
var RealLayerDirs = [][]string{{"src"}, {"pkg"}, {"bin", "lib", "misc", "api", "doc"}, {"test"}}

// RealImage is an image built from local files, in one compression.
type RealImage struct {
	Image       v1.Image
	Compression string // gzip or zstd
	// Layers are the compressed blobs, bottom first.
	Layers [][]byte
	// Compressed and Unpacked are the sums over the layers (blob bytes
	// and tar bytes).
	Compressed, Unpacked int64
}

// BuildRealImages tars the RealLayerDirs of root (GOROOT) once and
// compresses each layer with gzip and with zstd (default levels, as
// `docker push` and `buildah --compression-format zstd` would), so the two
// images have the same diff IDs and differ only in their blobs.
func BuildRealImages(root string) (gz, zst *RealImage, err error) {
	tars := make([][]byte, len(RealLayerDirs))
	for i, dirs := range RealLayerDirs {
		if tars[i], err = tarDirs(root, dirs); err != nil {
			return nil, nil, err
		}
	}
	if gz, err = realImage(tars, "gzip"); err != nil {
		return nil, nil, err
	}
	if zst, err = realImage(tars, "zstd"); err != nil {
		return nil, nil, err
	}
	return gz, zst, nil
}

// tarDirs writes dirs (relative to root) as one tar stream, entries named
// below usr/local/go/ as in the golang image, owned by root, in walk order.
func tarDirs(root string, dirs []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirs {
		base := filepath.Join(root, d)
		if _, err := os.Stat(base); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		err := filepath.WalkDir(base, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return tarEntry(tw, root, "usr/local/go/", p, de, false)
		})
		if err != nil {
			return nil, fmt.Errorf("tar %s: %w", base, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func realImage(tars [][]byte, compression string) (*RealImage, error) {
	ri := &RealImage{Compression: compression, Layers: make([][]byte, len(tars))}
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, t := range tars {
		g.Go(func() error {
			var buf bytes.Buffer
			var w io.WriteCloser
			if compression == "zstd" {
				zw, err := zstd.NewWriter(&buf)
				if err != nil {
					return err
				}
				w = zw
			} else {
				w = gzip.NewWriter(&buf)
			}
			if _, err := w.Write(t); err != nil {
				return err
			}
			if err := w.Close(); err != nil {
				return err
			}
			ri.Layers[i] = buf.Bytes()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	mt := types.OCILayer
	if compression == "zstd" {
		mt = types.OCILayerZStd
	}
	var adds []mutate.Addendum
	for i, t := range tars {
		l := &blobLayer{data: ri.Layers[i], mediaType: mt, diffID: sha(t)}
		l.digest = sha(l.data)
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: mt})
		ri.Compressed += int64(len(l.data))
		ri.Unpacked += int64(len(t))
	}
	var err error
	ri.Image, err = linuxImage(adds, func(cf *v1.ConfigFile) {
		cf.Config.Env = []string{"PATH=/usr/local/go/bin:/usr/bin:/bin"}
	})
	if err != nil {
		return nil, err
	}
	return ri, nil
}

// linuxImage is an OCI image of adds (bottom first) for linux on this
// machine's architecture, its config then changed by edit.
func linuxImage(adds []mutate.Addendum, edit func(cf *v1.ConfigFile)) (v1.Image, error) {
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	edit(cf)
	return mutate.ConfigFile(img, cf)
}

func sha(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
}

// blobLayer is a layer whose blob and digests are already known, so that
// building the image does not decompress it again.
type blobLayer struct {
	data           []byte
	digest, diffID v1.Hash
	mediaType      types.MediaType
}

func (l *blobLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *blobLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *blobLayer) Size() (int64, error)                { return int64(len(l.data)), nil }
func (l *blobLayer) MediaType() (types.MediaType, error) { return l.mediaType, nil }
func (l *blobLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.data)), nil
}
func (l *blobLayer) Uncompressed() (io.ReadCloser, error) {
	return image.Decompress(bytes.NewReader(l.data))
}

// unpackFloor is the least a pull of ri can cost on this machine: each
// layer decompressed in-process from memory (no network, no digests) and
// its entries written as plain files, directories, symlinks and hard links
// (no ownership, modes, times or checks), layers three at a time as berth
// does. No tar process is forked.
func unpackFloor(ri *RealImage, bounds string) *Floor {
	var ft floorTrees
	return &Floor{
		Name:   fmt.Sprintf("in-process %s -d + write of the %d layers", ri.Compression, len(ri.Layers)),
		Bounds: bounds,
		Setup: func(ctx context.Context) (any, error) {
			return nil, ft.setup("berth-bench-unpack-floor-")
		},
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			dir, err := ft.next(i)
			if err != nil {
				return 0, err
			}
			// Each layer a top-level tree of its own, as a layer in
			// berth's ingest/ is.
			if _, err := image.MarkTopDir(dir); err != nil {
				return 0, err
			}
			syscall.Sync() // as before each endpoint's sample
			settleFreedInodes()
			start := time.Now()
			err = writeLayers(dir, len(ri.Layers), func(j int, ld string) error { return writeLayer(ri.Layers[j], ld) })
			return time.Since(start), err
		},
		Teardown: func(ctx context.Context, _ any) { os.RemoveAll(ft.work) },
	}
}

// floorTrees are the trees an unpacking floor writes: one per sample,
// in a work dir beside berth's store.
type floorTrees struct{ work, prev string }

// setup makes the work dir: beside berth's store, the same filesystem,
// and the same placement of each sample's tree (decision 1512): without
// it, on ext4 without a journal, the floor pays for scanning past the
// inodes its previous sample just freed, which a pull no longer does.
func (ft *floorTrees) setup(prefix string) error {
	var err error
	if ft.work, err = os.MkdirTemp("", prefix); err != nil {
		return err
	}
	_, err = image.MarkTopDir(ft.work)
	return err
}

// next removes the previous sample's tree first, as an endpoint's image
// goes, so that this one waits its frees out too, and makes sample i's.
func (ft *floorTrees) next(i int) (string, error) {
	if err := os.RemoveAll(ft.prev); err != nil {
		return "", err
	}
	dir := filepath.Join(ft.work, fmt.Sprint(i))
	ft.prev = dir
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// writeLayers calls write for each of n layers with a new directory
// below dir, three layers at a time as berth unpacks them.
func writeLayers(dir string, n int, write func(j int, ld string) error) error {
	var g errgroup.Group
	g.SetLimit(3)
	for j := range n {
		g.Go(func() error {
			// A new name each time, as berth's ingest/layer-…: ext4
			// starts a top directory's placement from a hash of its
			// name, so "0" would go back to the group it just left.
			ld, err := os.MkdirTemp(dir, fmt.Sprintf("layer%d-", j))
			if err != nil {
				return err
			}
			return write(j, ld)
		})
	}
	return g.Wait()
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// writeLayer decompresses blob and writes its entries below dir.
func writeLayer(blob []byte, dir string) error { return writeLayerFrom(bytes.NewReader(blob), dir) }

// writeLayerFrom decompresses the blob r and writes its entries below dir.
func writeLayerFrom(r io.Reader, dir string) error {
	rc, err := image.Decompress(r)
	if err != nil {
		return err
	}
	defer rc.Close()
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(strings.TrimSuffix(hdr.Name, "/")))
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err != nil {
				if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
					f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				}
			}
			if err == nil {
				_, err = io.CopyBuffer(struct{ io.Writer }{f}, tr, *buf) // our buffer, not ReadFrom's
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		case tar.TypeSymlink:
			err = os.Symlink(hdr.Linkname, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(dir, filepath.FromSlash(hdr.Linkname)), p)
		}
		if err != nil {
			return fmt.Errorf("floor: %s: %w", hdr.Name, err)
		}
	}
}
