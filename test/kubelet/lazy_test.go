package kubelet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/mounttest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// lazyImageRef is the eStargz image TestKubeletLazyPull's pod runs.
const lazyImageRef = registryHost + "/lazy-web:1"

// A pod on the lazily pulled image: its container reads a prefetched
// file in a loop and logs each read; the readiness probe reads the same
// file, the liveness probe one fetched on demand (exec, both through
// berthd into a container whose rootfs is a FUSE mount served by the
// node's berth-lazy). Generous probe timeouts: an exec under load takes
// seconds, and a liveness probe timing out restarts the container.
const lazyPod = `apiVersion: v1
kind: Pod
metadata:
  name: lazy
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: reader
    image: {{IMAGE}}
    command: [sh, -c, "trap 'exit 0' TERM; while true; do cat /data/hello || echo READFAIL; sleep 0.2; done"]
    readinessProbe:
      exec: {command: [cat, /data/hello]}
      periodSeconds: 1
      timeoutSeconds: 10
    livenessProbe:
      exec: {command: [cat, /data/later]}
      periodSeconds: 2
      timeoutSeconds: 10
      failureThreshold: 5
`

// Files of the lazy image's data layer: one prefetched, one read on
// demand, and 512 KiB of random bytes first read after berthd's restart.
const (
	lazyHello = "hello from a lazy layer"
	lazyLater = "read on demand"
)

// TestKubeletLazyPull runs a pod through the kubelet on an all-eStargz
// image that berthd pulled lazily (issue 36, decision 3600), while the
// registry holds the layers' background fetch: the pod gets Ready with
// its exec probes passing, its log reads through the kubelet, and an exec
// works. berthd is then killed (-9) and started again with the fetch
// still held: the pod stays Ready on the same container (restart count
// 0), its reads never fail, a file never read before reads right through
// the new berthd. Released, the fetch completes (complete.json in each
// layer's dir, ImageStatus counting the whole blobs), the pod still runs
// on; deleted with its image, it leaves nothing.
func TestKubeletLazyPull(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet")
	filler := make([]byte, 512<<10)
	if _, err := rand.Read(filler); err != nil {
		t.Fatal(err)
	}
	fillerSum := sha256.Sum256(filler)
	plain, err := testimages.Build([][]testimages.File{{
		{Name: "data", Dir: true},
		{Name: "data/hello", Data: []byte(lazyHello + "\n")},
		{Name: "data/filler", Data: filler},
		{Name: "data/later", Data: []byte(lazyLater + "\n")},
	}}, v1.Config{Cmd: []string{"sh"}})
	img := testimages.EStargz(t, testimages.Must(t, plain, err), "bin/busybox", "data/hello")
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}

	// Lazy pulling is on by default (decision 3600); this berthd says so
	// anyway, so the test keeps testing it if the default changes.
	e := newEnv(t, bins, envOptions{Berthd: berthdtest.Options{Configure: func(c *config.Config) { c.ImageLazyPull.Enable = true }}})
	hold := testimages.NewWholeHold(t)
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// ImageStatus's size of the image once its layers are complete (not
	// before: a lazy layer counts the chunks it holds, decompressed).
	full := uint64(len(rawCfg))
	for _, l := range mf.Layers {
		e.reg.ServeBlobWith(t, l.Digest.String(), hold.Serve)
		full += uint64(l.Size)
	}
	e.reg.Push(t, strings.TrimPrefix(lazyImageRef, registryHost+"/"), img)
	k, d := e.k, e.d
	scope := e.leakScope()
	scope.Root = d.Root // the image store: the lazy layers' dirs and mounts
	before := leakcheck.Take(t, scope)

	k.Apply(t, "lazy", render(lazyPod, map[string]string{"IMAGE": lazyImageRef}))
	p := k.WaitPod(t, "lazy", "Ready", 3*time.Minute, func(p *corev1.Pod) bool {
		s := ctrStatus(p, "reader")
		return podReady(p) && s != nil && s.State.Running != nil
	})
	was := instances(p)["reader"]

	// Lazy: both layers mounted through FUSE, neither complete, the
	// background fetch waiting on the registry.
	layerDirs := lazyLayerDirs(t, d)
	if len(layerDirs) != len(mf.Layers) {
		t.Fatalf("lazy layer dirs %q, want one per layer (%d)", layerDirs, len(mf.Layers))
	}
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != len(mf.Layers) {
		t.Fatalf("FUSE mounts below berthd's root: %q, want one per layer", m)
	}
	requireIncomplete(t, layerDirs)
	waitFor(t, "the background fetch to ask for the blobs", time.Minute, func() bool { return hold.WholeGets() >= len(mf.Layers) })

	logsHave := func(what string, n int) {
		t.Helper()
		waitFor(t, what, time.Minute, func() bool {
			s, err := k.Logs("lazy", "reader", nil)
			return err == nil && strings.Count(s, lazyHello+"\n") >= n
		})
	}
	logsHave("the reader's log through the kubelet", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stdout, _, st, err := k.Exec(ctx, "lazy", "reader", "cat", "/data/later")
	if err != nil || stdout != lazyLater+"\n" || !strings.Contains(st, `"Success"`) {
		t.Fatalf("exec cat /data/later: stdout %q status %s err %v", stdout, st, err)
	}
	requireIncomplete(t, layerDirs)

	// berthd killed and started again while the fetch is held: the
	// layers stay served by the keeper's berth-lazy meanwhile.
	logMark := len(k.Log())
	asked := hold.WholeGets()
	d.Kill()
	waitFor(t, "the kubelet to find the runtime down", time.Minute, func() bool {
		l := k.Log()[logMark:]
		return strings.Contains(l, "Container runtime sanity check failed") || strings.Contains(l, "Skipping pod synchronization")
	})
	d.Start()
	d.WaitReady()
	// Taken up, not dropped: the image stays listed and its layers
	// mounted (a berthd that dropped them removed the image, and the
	// pod's reads failed until its liveness probe restarted it).
	imageSize(t, d)
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != len(mf.Layers) {
		t.Fatalf("FUSE mounts below berthd's root after its restart: %q, want one per layer", m)
	}
	waitFor(t, "exec through the kubelet to work again", time.Minute, func() bool {
		out, err := k.Run("lazy", "reader", "cat", "/data/hello")
		return err == nil && strings.TrimSpace(out) == lazyHello
	})
	// The new berthd takes the layers up and fetches them again (held).
	waitFor(t, "the new berthd's background fetch to ask for the blobs", time.Minute, func() bool { return hold.WholeGets() >= asked+len(mf.Layers) })
	requireIncomplete(t, layerDirs)
	// Never read before: its chunks come through the new berthd.
	if out := k.MustRun(t, "lazy", "reader", "sha256sum", "/data/filler"); !strings.HasPrefix(out, hex.EncodeToString(fillerSum[:])+" ") {
		t.Fatalf("sha256sum /data/filler after berthd's restart: %q, want %x", out, fillerSum)
	}
	n := strings.Count(mustLogs(t, k), lazyHello+"\n")
	logsHave("the reader's log to grow after berthd's restart", n+3)

	// The background fetch, resumed by the new berthd, completes.
	hold.Release()
	waitFor(t, "the lazy layers to complete", 2*time.Minute, func() bool {
		for _, dir := range layerDirs {
			if _, err := os.Stat(filepath.Join(dir, "complete.json")); err != nil {
				return false
			}
		}
		return true
	})
	if size := imageSize(t, d); size != full {
		t.Errorf("ImageStatus size %d once complete, want %d (the config and the layer blobs)", size, full)
	}

	// Several relists and probes: a container berthd wrongly called
	// exited, or a failing liveness probe, would restart it meanwhile. A
	// soak, not a timing assertion.
	time.Sleep(5 * time.Second)
	p = k.WaitPod(t, "lazy", "Ready after berthd's restart and the fetch", 2*time.Minute, podReady)
	if now := instances(p)["reader"]; now != was || now.restarts != 0 {
		t.Errorf("container %+v after berthd's restart and the fetch, was %+v (restarted)", now, was)
	}
	if out := k.MustRun(t, "lazy", "reader", "cat", "/data/later"); strings.TrimSpace(out) != lazyLater {
		t.Errorf("cat /data/later from the complete layer: %q", out)
	}
	if logs := mustLogs(t, k); strings.Contains(logs, "READFAIL") {
		t.Errorf("the reader's reads failed:\n%s", logs)
	}

	k.Delete(t, "lazy")
	k.WaitGone(t, "lazy", 2*time.Minute)
	waitFor(t, "the kubelet to remove every sandbox and container", 150*time.Second, func() bool {
		sbs, err1 := d.Runtime.ListPodSandbox(context.Background(), &criapi.ListPodSandboxRequest{})
		ctrs, err2 := d.Runtime.ListContainers(context.Background(), &criapi.ListContainersRequest{})
		return err1 == nil && err2 == nil && len(sbs.Items) == 0 && len(ctrs.Containers) == 0
	})
	// The kubelet keeps images (its image GC is off here): the test
	// removes it, and with it the layers, their mounts and the node's
	// lazy-layer server.
	if _, err := d.Image.RemoveImage(context.Background(), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: lazyImageRef}}); err != nil {
		t.Fatalf("RemoveImage %s: %v", lazyImageRef, err)
	}
	var left []string
	deadline := time.Now().Add(time.Minute)
	for {
		left = left[:0]
		for _, l := range e.leaksIn(scope, before) {
			// host-local's dataDir, made by the first pod and kept: the
			// ipam category counts its reservations.
			if !strings.HasPrefix(l, "root-entry: "+filepath.Join(d.Root, "cni")+"/") && l != "root-entry: "+filepath.Join(d.Root, "cni") {
				left = append(left, l)
			}
		}
		if len(berthdtest.ShimPids(d.State, "keeper"))+len(berthdtest.ShimPids(d.State, "monitor")) > 0 {
			left = append(left, "berth-shim processes")
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left a minute after the pod and its image went:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// imageSize is ImageStatus's size of lazyImageRef on d.
func imageSize(t *testing.T, d *berthdtest.Daemon) uint64 {
	t.Helper()
	is, err := d.Image.ImageStatus(context.Background(), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: lazyImageRef}})
	if err != nil || is.Image == nil {
		t.Fatalf("ImageStatus %s: %v, %v", lazyImageRef, is.GetImage(), err)
	}
	return is.Image.Size
}

// mustLogs is the reader's whole log through the kubelet.
func mustLogs(t *testing.T, k *kubelet) string {
	t.Helper()
	s, err := k.Logs("lazy", "reader", nil)
	if err != nil {
		t.Fatalf("the reader's log: %v", err)
	}
	return s
}

// lazyLayerDirs are the dirs of d's lazy layers (those with a lazy.json).
func lazyLayerDirs(t *testing.T, d *berthdtest.Daemon) []string {
	t.Helper()
	metas, err := filepath.Glob(filepath.Join(d.Root, "images", "layers", "*", "lazy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, m := range metas {
		dirs = append(dirs, filepath.Dir(m))
	}
	return dirs
}

// requireIncomplete fails t if a lazy layer of dirs is complete: the
// background fetch got past the registry's hold.
func requireIncomplete(t *testing.T, dirs []string) {
	t.Helper()
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "complete.json")); err == nil {
			t.Fatalf("lazy layer %s complete while its fetch is held", dir)
		}
	}
}
