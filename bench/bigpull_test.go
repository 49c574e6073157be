package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkBigPull pulls the big image (≥ 4 GB unpacked, bigimage.go) in
// gzip and zstd from a registry shaped like a remote one (BigShape), with
// berth's range fetch on and off, against the reference runtime and the
// floor, all in one run; it writes bigpull.{md,json,png}. Selected by
// $BENCH_WORKLOADS containing "big" (or empty).
func BenchmarkBigPull(b *testing.B) {
	only := os.Getenv("BENCH_WORKLOADS")
	if !selected(only, "big image pull gzip") && !selected(only, "big image pull zstd") {
		b.Skip("big image pull not selected")
	}
	gz, zst, err := BuildBigImages(BigImageCacheDir(), goroot(b))
	if err != nil {
		b.Fatal(err)
	}
	shaped := startBigShaped(b)
	defer shaped.Close()
	reg := pauseRegistry(b)

	eps := []*Endpoint{StartBerth(b)}
	if os.Getenv("BENCH_BIG_NO_1STREAM") == "" {
		eps = append(eps, StartBerthWith(b, "berth-1stream", func(c *config.Config) { c.ImageRangeFetch.Enable = false }))
	}
	if os.Getenv("BENCH_NO_REF") == "" {
		if ref := StartReference(b, reg.Host, shaped.Host); ref != nil {
			eps = append(eps, ref)
		}
	}
	names := endpointNames(eps)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()
	cmp := NewComparison(names...)
	for _, bi := range []*BigImage{gz, zst} {
		repo := "big-" + bi.Compression
		if err := shaped.Add(repo+":latest", bi.Image, bi.Layers.Files()); err != nil {
			b.Fatal(err)
		}
		w := BigPullWorkload(bi, shaped, shaped.Ref(repo+":latest"))
		if selected(only, w.Name) {
			cmp.Run(ctx, w, eps...)
		}
	}
	dir := benchOutDir(b, "bigpull")
	if err := cmp.Write(os.Stdout, dir); err != nil {
		b.Fatal(err)
	}
}

// benchOutDir is $BENCH_OUT/name, made, or "" when $BENCH_OUT is unset.
func benchOutDir(b *testing.B, name string) string {
	dir := os.Getenv("BENCH_OUT")
	if dir == "" {
		return ""
	}
	dir = filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	return dir
}

// goroot is `go env GOROOT`: the big images carry its toolchain.
func goroot(b *testing.B) string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// endpointNames are the names of eps, in order.
func endpointNames(eps []*Endpoint) []string {
	names := make([]string, len(eps))
	for i, ep := range eps {
		names[i] = ep.Name
	}
	return names
}

// startBigShaped is a registry shaped by BigShape; the caller closes it.
func startBigShaped(b *testing.B) *ShapedRegistry {
	shaped, err := StartShapedRegistry(BigShape)
	if err != nil {
		b.Fatal(err)
	}
	return shaped
}

// pauseRegistry is a plain registry holding pause:latest: the reference
// runtime's sandbox image comes from it.
func pauseRegistry(b *testing.B) *testimages.Registry {
	reg := testimages.StartRegistry(b)
	reg.Push(b, "pause:latest", pauseImage(b))
	return reg
}
