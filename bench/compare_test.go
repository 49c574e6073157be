package bench

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/testimages"
)

// pauseImage is a stand-in for the reference runtime's sandbox image: busybox
// sleeping forever, served from the local registry.
func pauseImage(tb testing.TB) v1.Image {
	tb.Helper()
	files, err := testimages.BaseFiles()
	if err != nil {
		tb.Fatal(err)
	}
	layer, err := testimages.Layer(files)
	if err != nil {
		tb.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		tb.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		tb.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{"/bin/sleep", "2147483647"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		tb.Fatal(err)
	}
	return img
}

// BenchmarkCompare runs the CRI workloads against berth and the reference
// runtime, alternating sample by sample with the floor of each workload
// (the tools a runtime drives, run alone), and writes
// compare.{md,json,png}.
func BenchmarkCompare(b *testing.B) {
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	reg.Push(b, "pause:latest", pauseImage(b))
	image := reg.Ref(testimages.BusyboxRef)
	multi := reg.Ref(testimages.MultiLayerRef)

	eps := []*Endpoint{StartBerth(b)}
	if os.Getenv("BENCH_NO_REF") == "" {
		if ref := StartReference(b, reg.Host); ref != nil {
			eps = append(eps, ref)
		}
	}
	names := make([]string, len(eps))
	for i, ep := range eps {
		names[i] = ep.Name
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	cmp := NewComparison(names...)
	for _, ep := range eps {
		if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: image}}); err != nil {
			cmp.skip(ep.Name, "all workloads (pull "+image+")", unsupported(err))
		}
	}
	multiImg, err := testimages.MultiLayer()
	if err != nil {
		b.Fatal(err)
	}
	floors := NewFloors(b, eps[0].Daemon, image, multiImg)
	only := os.Getenv("BENCH_WORKLOADS")
	for _, w := range Workloads(image, multi, floors) {
		if selected(only, w.Name) {
			cmp.Run(ctx, w, eps...)
		}
	}
	for _, w := range realPullWorkloads(b, reg, only) {
		cmp.Run(ctx, w, eps...)
	}
	for _, ep := range eps {
		if !selected(only, "scale") {
			break
		}
		res, err := Scale(ctx, ep, image, 48, 8)
		if err != nil {
			cmp.skip(ep.Name, "48 pods at 8 in parallel", unsupported(err))
			continue
		}
		cmp.Scale[ep.Name] = res
	}
	if err := cmp.Write(os.Stdout, os.Getenv("BENCH_OUT")); err != nil {
		b.Fatal(err)
	}
}

// realPullWorkloads builds the real-size images from this machine's Go
// toolchain (only when selected: building them takes seconds), pushes
// them and returns their pull workloads.
func realPullWorkloads(b *testing.B, reg *testimages.Registry, only string) []Workload {
	var ws []Workload
	if !selected(only, "image pull real size gzip") && !selected(only, "image pull real size zstd") {
		return nil
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Logf("no real-size pull: go env GOROOT: %v", err)
		return nil
	}
	gz, zst, err := BuildRealImages(strings.TrimSpace(string(out)))
	if err != nil {
		b.Fatalf("build real-size images: %v", err)
	}
	for _, ri := range []*RealImage{gz, zst} {
		w := RealPullWorkload(ri, reg.Ref("real-"+ri.Compression+":latest"))
		if selected(only, w.Name) {
			reg.Push(b, "real-"+ri.Compression+":latest", ri.Image)
			ws = append(ws, w)
		}
	}
	return ws
}

// selected reports whether the workload name is one of only's
// comma-separated parts (substrings); an empty only selects all.
func selected(only, name string) bool {
	if only == "" {
		return true
	}
	for _, part := range strings.Split(only, ",") {
		if part = strings.TrimSpace(part); part != "" && strings.Contains(name, part) {
			return true
		}
	}
	return false
}
