package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// unpackRuns is how many times each variant unpacks the whole image.
const unpackRuns = 15

// BenchmarkImageUnpack measures berth's layer unpack (decompress, checks,
// whiteout conversion, metadata) on the multi-layer test image and on a
// synthetic 64 MB layer, next to GNU `tar -xzf` of the very same gzip
// layers on this machine. Rates are over uncompressed tar bytes.
func BenchmarkImageUnpack(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("unpack needs root (chown, mknod, trusted xattrs)")
	}
	if _, err := exec.LookPath("tar"); err != nil {
		b.Skip("tar not installed")
	}
	img, err := testimages.MultiLayer()
	if err != nil {
		b.Fatal(err)
	}
	multi, err := GzipLayers(img)
	if err != nil {
		b.Fatal(err)
	}
	big := [][]byte{syntheticLayer(b, 256, 256<<10)}
	work := b.TempDir()

	var latency []Series
	var rates []Throughput
	for _, set := range []struct {
		name   string
		layers [][]byte
	}{{"busybox-multilayer (4 layers)", multi}, {"synthetic 256 files x 256 KiB", big}} {
		size := uncompressedSize(b, set.layers)
		files := make([]string, len(set.layers))
		for i, l := range set.layers {
			files[i] = filepath.Join(work, fmt.Sprintf("layer%d.tar.gz", i))
			if err := os.WriteFile(files[i], l, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		berth := Series{Name: "berth unpack: " + set.name}
		gnu := Series{Name: "tar -xzf: " + set.name}
		for run := 0; run < unpackRuns; run++ {
			dir := filepath.Join(work, fmt.Sprintf("berth-%d", run))
			start := time.Now()
			for i, f := range files {
				unpackFile(b, f, filepath.Join(dir, fmt.Sprint(i)))
			}
			berth.Samples = append(berth.Samples, time.Since(start))
			os.RemoveAll(dir)

			dir = filepath.Join(work, fmt.Sprintf("tar-%d", run))
			start = time.Now()
			for i, f := range files {
				d := filepath.Join(dir, fmt.Sprint(i))
				if err := os.MkdirAll(d, 0o755); err != nil {
					b.Fatal(err)
				}
				if out, err := exec.Command("tar", "-xzf", f, "-C", d).CombinedOutput(); err != nil {
					b.Fatalf("tar: %v\n%s", err, out)
				}
			}
			gnu.Samples = append(gnu.Samples, time.Since(start))
			os.RemoveAll(dir)
		}
		latency = append(latency, berth, gnu)
		rates = append(rates, Throughput{Name: berth.Name, Bytes: size, Samples: berth.Samples},
			Throughput{Name: gnu.Name, Bytes: size, Samples: gnu.Samples})
	}
	if err := Report(os.Stdout, "image_unpack", latency...); err != nil {
		b.Fatal(err)
	}
	if err := ReportThroughput(os.Stdout, "image_unpack_throughput", rates...); err != nil {
		b.Fatal(err)
	}
}

func unpackFile(b *testing.B, file, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rc, err := image.Decompress(f)
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	if _, err := image.Unpack(context.Background(), rc, dir, file, image.UnpackOptions{}); err != nil {
		b.Fatal(err)
	}
}

// syntheticLayer is a gzip tar of n files of size bytes of incompressible-ish data.
func syntheticLayer(b *testing.B, n, size int) []byte {
	files := []testimages.File{{Name: "data", Dir: true}}
	block := make([]byte, size)
	for i := range block {
		block[i] = byte(i*7 + i/251)
	}
	for i := 0; i < n; i++ {
		data := bytes.Clone(block)
		data[0] = byte(i)
		files = append(files, testimages.File{Name: fmt.Sprintf("data/f%03d", i), Data: data})
	}
	l, err := testimages.Layer(files)
	if err != nil {
		b.Fatal(err)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := io.Copy(zw, rc); err != nil {
		b.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

func uncompressedSize(b *testing.B, layers [][]byte) int64 {
	var total int64
	for _, l := range layers {
		zr, err := gzip.NewReader(bytes.NewReader(l))
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, zr)
		if err != nil {
			b.Fatal(err)
		}
		total += n
	}
	return total
}

// BenchmarkImagePull measures PullImage of the multi-layer image from an
// in-process registry over loopback: cold (removed before each pull: every
// blob downloaded, verified and unpacked) and warm (already stored: only
// the manifest is resolved again).
func BenchmarkImagePull(b *testing.B) {
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	d := berthdtest.Start(b, berthdtest.Options{})
	ctx := context.Background()
	ref := reg.Ref(testimages.MultiLayerRef)
	req := &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}
	cold := Series{Name: "cold pull (4 layers, " + testimages.MultiLayerRef + ")"}
	warm := Series{Name: "warm pull (image present)"}
	for i := 0; i < 10; i++ {
		if _, err := d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := d.Image.PullImage(ctx, req); err != nil {
			b.Fatal(err)
		}
		cold.Samples = append(cold.Samples, time.Since(start))
		start = time.Now()
		if _, err := d.Image.PullImage(ctx, req); err != nil {
			b.Fatal(err)
		}
		warm.Samples = append(warm.Samples, time.Since(start))
	}
	if err := Report(os.Stdout, "image_pull", cold, warm); err != nil {
		b.Fatal(err)
	}
}
