package security

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc/codes"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestUnpackSparseTerabyteRefusedAndStops (issue 34 finding 3): a layer
// whose one entry is a 3 KiB GNU sparse file that reads as 1 TiB of
// zeros is refused from its header (ResourceExhausted naming the limit),
// what the pull wrote is removed, and berthd does no more work after the
// refusal. On b407862 the pull failed by the progress timeout (here 10 s)
// with DeadlineExceeded and berthd went on unpacking.
func TestUnpackSparseTerabyteRefusedAndStops(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.ImagePullProgressTimeout = config.Duration(10 * time.Second)
	}})
	reg := testimages.StartRegistry(t)
	reg.Push(t, "sparse:1", unpackImage(t, []string{"true"}, unpackLayerOf(t, testimages.SparseTar("big", 1<<40))))

	err := unpackPull(t, d, reg.Ref("sparse:1"))
	berthdtest.WantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "image_limits.max_layer_size") {
		t.Fatalf("refusal %q does not name the limit", err)
	}
	unpackIngestEmpty(t, d)

	// No work after the refusal: berthd's CPU time over an idle moment.
	// A generous bound: this proves the unpack stopped, not a speed.
	before := unpackCPUTicks(t, d.Pid())
	time.Sleep(3 * time.Second)
	if used := unpackCPUTicks(t, d.Pid()) - before; used > 50 {
		t.Fatalf("berthd used %d ms of CPU in the 3 s after the refusal: the unpack goes on", used*10)
	}
}

// TestUnpackBoundsRefused (issue 34 finding 4): a layer past the
// directory limit, a zstd layer whose one file is 256 MiB of zeros, and a
// zstd layer that goes on with 256 MiB of zeros after its tar's end are
// each refused with ResourceExhausted naming the limit (set low here:
// [image_limits] is configurable), and leave nothing behind. On b407862
// every one of them was pulled, whatever its size.
func TestUnpackBoundsRefused(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.ImageLimits.MaxLayerDirs = 1000
		c.ImageLimits.MaxLayerSize = 64 << 20
	}})
	reg := testimages.StartRegistry(t)

	var dirs []*tar.Header
	for i := 0; i < 3000; i++ {
		dirs = append(dirs, &tar.Header{Name: fmt.Sprintf("many/d%05d/", i), Typeflag: tar.TypeDir})
	}
	const zeros = 256 << 20
	zeroFile := func() io.Reader {
		var hdr bytes.Buffer
		tw := tar.NewWriter(&hdr)
		if err := tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: zeros}); err != nil {
			t.Fatal(err)
		}
		// The data and the end: written by hand after the header.
		return io.MultiReader(&hdr, io.LimitReader(unpackZeros{}, zeros), bytes.NewReader(make([]byte, 1024)))
	}
	zeroTail := func() io.Reader {
		small := unpackTar(t, []*tar.Header{{Name: "small", Typeflag: tar.TypeReg}}, map[string]string{"small": "x"})
		return io.MultiReader(bytes.NewReader(small), io.LimitReader(unpackZeros{}, zeros))
	}
	for _, tc := range []struct {
		name  string
		layer func(t *testing.T) *unpackRawLayer
		limit string
	}{
		{"many directories", func(t *testing.T) *unpackRawLayer {
			l := unpackLayerOf(t, unpackTar(t, dirs, nil))
			blob, _ := l.Compressed()
			b, _ := io.ReadAll(blob)
			id, _ := l.DiffID()
			return &unpackRawLayer{blob: b, diffID: id, mt: types.OCILayer}
		}, "image_limits.max_layer_dirs"},
		{"zstd file of zeros", func(t *testing.T) *unpackRawLayer {
			return &unpackRawLayer{blob: unpackZstd(t, zeroFile()), diffID: unpackDiffID(t, zeroFile()), mt: types.OCILayerZStd}
		}, "image_limits.max_layer_size"},
		{"zstd zeros after the tar end", func(t *testing.T) *unpackRawLayer {
			return &unpackRawLayer{blob: unpackZstd(t, zeroTail()), diffID: unpackDiffID(t, zeroTail()), mt: types.OCILayerZStd}
		}, "image_limits.max_layer_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := strings.ReplaceAll(tc.name, " ", "-") + ":1"
			reg.Push(t, repo, unpackImage(t, []string{"true"}, tc.layer(t)))
			err := unpackPull(t, d, reg.Ref(repo))
			berthdtest.WantCode(t, err, codes.ResourceExhausted)
			if !strings.Contains(err.Error(), tc.limit) {
				t.Fatalf("refusal %q does not name %s", err, tc.limit)
			}
			unpackIngestEmpty(t, d)
		})
	}
}

type unpackZeros struct{}

func (unpackZeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func unpackZstd(t *testing.T, r io.Reader) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(zw, r); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
