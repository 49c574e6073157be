package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/config"
)

// BenchmarkLazyPull starts a container on a big eStargz image (weights
// that barely compress plus the Go toolchain's bin and pkg/tool) from
// the shaped registry of BenchmarkBigPull: berth with lazy pulling on,
// berth pulling in full, the reference runtime, and the floor (only the
// bytes read), all in one run; then reads the weights with the image
// whole (FUSE against overlayfs). It writes lazypull/{compare,goals}.*
// and lazypull-read.json. Selected by $BENCH_WORKLOADS containing
// "lazy pull" (or empty); sized by $BENCH_LAZY_WEIGHTS_MB (3072) and
// $BENCH_LAZY_READ_MB (64).
func BenchmarkLazyPull(b *testing.B) {
	if !selected(os.Getenv("BENCH_WORKLOADS"), "lazy pull") {
		b.Skip("lazy pull not selected")
	}
	weightsMB, readMB := envInt(b, "BENCH_LAZY_WEIGHTS_MB", 3072), envInt(b, "BENCH_LAZY_READ_MB", 64)
	if readMB > weightsMB {
		b.Fatalf("BENCH_LAZY_READ_MB %d is more than BENCH_LAZY_WEIGHTS_MB %d", readMB, weightsMB)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Minute)
	defer cancel()
	li, err := BuildLazyImage(ctx, BigImageCacheDir(), goroot(b), weightsMB)
	if err != nil {
		b.Fatal(err)
	}
	shaped := startBigShaped(b)
	defer shaped.Close()
	if err := shaped.Add("lazy:latest", li.Image, li.Layers.Files()); err != nil {
		b.Fatal(err)
	}
	reg := pauseRegistry(b)

	eps := []*Endpoint{
		StartBerthWith(b, "berth-lazy", func(c *config.Config) { c.ImageLazyPull.Enable = true }),
		StartBerthWith(b, "berth-full", func(c *config.Config) { c.ImageLazyPull.Enable = false }),
	}
	refName := ""
	if os.Getenv("BENCH_NO_REF") == "" {
		if ref := StartReference(b, reg.Host, shaped.Host); ref != nil {
			eps = append(eps, ref)
			refName = ref.Name
		}
	}
	names := endpointNames(eps)
	const warm = 1
	var reads lazyReads
	readBytes := int64(readMB) << 20
	w := LazyPullWorkload(li, shaped, shaped.Ref("lazy:latest"), readBytes, warm, &reads)
	cmp := NewComparison(names...)
	cmp.Run(ctx, w, eps...)
	dir := benchOutDir(b, "lazypull")
	if err := cmp.Write(os.Stdout, dir); err != nil {
		b.Fatal(err)
	}
	tp := reads.throughputs(names, li.WeightsBytes)
	if err := ReportThroughput(os.Stdout, "lazypull-read", tp...); err != nil {
		b.Fatal(err)
	}
	goals := lazyGoals(cmp, newLazySeries(li, readBytes, shaped.Shape).ready, tp, "berth-lazy", "berth-full", refName)
	if err := writeLazyGoals(os.Stdout, dir, goals); err != nil {
		b.Fatal(err)
	}
}

// envInt is $name as a positive integer, or def when unset.
func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("$%s=%q: want a positive integer", name, v)
	}
	return n
}
