package integration

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/image/estargzconv"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Lazy pulling (issue 36, decision 3600), stage S2: eStargz layers
// mounted before they have arrived.

// lazyLater is /data/later: not prioritized, so it comes when read.
const lazyLater = "read on demand"

// lazyLayerFiles is the data layer of the lazy test images: a
// prioritized file, one read on demand, and 512 KiB no test reads.
func lazyLayerFiles(t *testing.T) []testimages.File {
	t.Helper()
	filler := make([]byte, 512<<10)
	if _, err := rand.Read(filler); err != nil {
		t.Fatal(err)
	}
	return []testimages.File{
		{Name: "data", Dir: true},
		{Name: "data/hello", Data: []byte(lazyHello + "\n")},
		{Name: "data/filler", Data: filler},
		{Name: "data/later", Data: []byte(lazyLater + "\n")},
	}
}

// layerOf is img's layer i: its blob, digest and descriptor annotations.
func layerOf(t *testing.T, img v1.Image, i int) ([]byte, string, map[string]string) {
	t.Helper()
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[i].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	blob, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return blob, mf.Layers[i].Digest.String(), mf.Layers[i].Annotations
}

// rangeLog records the Range header of every GET of some blobs.
type rangeLog struct {
	mu     sync.Mutex
	ranges map[string][]string // digest → Range headers ("" for a whole GET)
}

// watch serves digest through the log; corrupt, if set, changes what
// it sends.
func (l *rangeLog) watch(t *testing.T, reg *testimages.Registry, digest string, corrupt func(body []byte) []byte) {
	reg.ServeBlobWith(t, digest, func(w http.ResponseWriter, req *http.Request, body []byte) {
		l.mu.Lock()
		if l.ranges == nil {
			l.ranges = map[string][]string{}
		}
		l.ranges[digest] = append(l.ranges[digest], req.Header.Get("Range"))
		l.mu.Unlock()
		if corrupt != nil {
			body = corrupt(bytes.Clone(body))
		}
		start, end, _ := testimages.RangeOf(w, req, len(body))
		_, _ = w.Write(body[start:end])
	})
}

func (l *rangeLog) of(digest string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ranges[digest])
}

// lazyMountsBelow are the FUSE mounts of lazy layers under dir.
func lazyMountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || !strings.HasPrefix(f[4], dir+"/") {
			continue
		}
		if i := slices.Index(f, "-"); i > 0 && i+1 < len(f) && strings.HasPrefix(f[i+1], "fuse") {
			out = append(out, f[4])
		}
	}
	return out
}

// requireNoBlob fails t if the blob digest is in d's store.
func requireNoBlob(t *testing.T, d *berthdtest.Daemon, digest string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(d.Root, "images", "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))); err == nil {
		t.Fatalf("blob %s was downloaded whole", digest)
	}
}

// TestLazyPullRunsBeforeTheLayerArrives pulls an all-eStargz image: each
// layer is mounted (FUSE) with its TOC and prioritized files fetched, no
// blob is downloaded whole, a container reads a prefetched file and one
// fetched on demand, and removing the image unmounts and removes it all.
func TestLazyPullRunsBeforeTheLayerArrives(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	src := buildImage(t, [][]testimages.File{lazyLayerFiles(t)})
	img := testimages.EStargz(t, src, "bin/busybox", "data/hello")
	var log rangeLog
	var digests []string
	for i := range 2 {
		_, d, _ := layerOf(t, img, i)
		digests = append(digests, d)
		log.watch(t, reg, d, nil)
	}
	reg.Push(t, "lazy/run:1", img)
	d, scope, before := lazyDaemon(t, berthdtest.Options{})

	ref := reg.Ref("lazy/run:1")
	pull(t, d, ref, nil)
	if m := lazyMountsBelow(t, d.Root); len(m) != 2 {
		t.Fatalf("lazy mounts after the pull: %q, want both layers", m)
	}
	for _, dg := range digests {
		requireNoBlob(t, d, dg)
		for _, r := range log.of(dg) {
			if !strings.HasPrefix(r, "bytes=") {
				t.Fatalf("layer %s: a GET without a range: %q", dg, log.of(dg))
			}
		}
	}
	dataReqs := len(log.of(digests[1]))
	if got := catInPod(t, d, reg, ref, "/data/hello"); got != lazyHello {
		t.Fatalf("prefetched file: %q", got)
	}
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("file fetched on demand: %q", got)
	}
	if n := len(log.of(digests[1])); n <= dataReqs {
		t.Fatalf("reading /data/later made no range request (%d before, %d after)", dataReqs, n)
	}
	requireNoBlob(t, d, digests[1])
	if _, err := d.Image.RemoveImage(ctxT(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	if m := lazyMountsBelow(t, d.Root); len(m) != 0 {
		t.Fatalf("lazy mounts after RemoveImage: %q", m)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// TestLazyPullCorruptChunkIsEIOAndImageNotKept serves a lazy layer whose
// not-prefetched chunk is corrupt: the pull succeeds (the TOC and the
// prefetch verify), the container's read of that file fails with EIO,
// the image is removed (not kept), and once the container is gone
// nothing is left.
func TestLazyPullCorruptChunkIsEIOAndImageNotKept(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	src := buildImage(t, [][]testimages.File{lazyLayerFiles(t)})
	img := testimages.EStargz(t, src, "bin/busybox", "data/hello")
	blob, dataDigest, _ := layerOf(t, img, 1)
	r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
	if err != nil {
		t.Fatal(err)
	}
	later, ok := r.Lookup("data/later")
	if !ok {
		t.Fatal("data/later not in the TOC")
	}
	var log rangeLog
	log.watch(t, reg, dataDigest, func(body []byte) []byte {
		// Inside data/later's gzip member: its deflate data.
		for i := later.Offset + 12; i < later.NextOffset()-8 && i < later.Offset+20; i++ {
			body[i] ^= 0x55
		}
		return body
	})
	reg.Push(t, "lazy/corrupt:1", img)
	d, scope, before := lazyDaemon(t, berthdtest.Options{})
	ref := reg.Ref("lazy/corrupt:1")
	pull(t, d, ref, nil)

	e := &ctrEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	e.podCfg = podConfig("lazy-corrupt")
	e.podCfg.LogDirectory = e.logDir
	e.podCfg.Linux.CgroupParent = ""
	e.pod = runPod(t, d, e.podCfg)
	cfg := e.config("cat", "sh", "-c", "cat /data/hello; cat /data/later")
	cfg.Image.Image = ref
	id := e.run(cfg)
	st := e.waitExited(id)
	out := readCRILog(t, st.LogPath)
	var text []string
	for _, rec := range out {
		text = append(text, rec.stream+": "+rec.msg)
	}
	joined := strings.Join(text, "\n")
	if st.ExitCode == 0 || !strings.Contains(joined, "stdout: "+lazyHello) || !strings.Contains(joined, "Input/output error") {
		t.Fatalf("exit %d, output:\n%s\nwant the prefetched file, then an I/O error", st.ExitCode, joined)
	}
	// Not kept: the image goes (the container keeps its layers meanwhile).
	waitFor(t, func() bool { return imageStatus(t, d, ref) == nil })
	stopRemove(t, d, e.pod)
	waitFor(t, func() bool { return len(lazyMountsBelow(t, d.Root)) == 0 })
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	// Pulled again, it is fetched again (and is as corrupt).
	pull(t, d, ref, nil)
	if _, err := d.Image.RemoveImage(ctxT(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
}

// TestLazyPullMixedLayers pulls an image whose base layer is plain gzip
// and whose top layer is eStargz: the base is downloaded and unpacked as
// today, the top is mounted lazily, and a container sees both.
func TestLazyPullMixedLayers(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	plain := buildImage(t, nil)
	top := testimages.EStargz(t, buildImage(t, [][]testimages.File{lazyLayerFiles(t)}), "data/hello")
	baseLayers, err := plain.Layers()
	if err != nil {
		t.Fatal(err)
	}
	topLayers, err := top.Layers()
	if err != nil {
		t.Fatal(err)
	}
	_, topDigest, ann := layerOf(t, top, 1)
	img, err := mutate.Append(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON),
		mutate.Addendum{Layer: baseLayers[0], MediaType: types.OCILayer},
		mutate.Addendum{Layer: topLayers[1], MediaType: types.OCILayer, Annotations: map[string]string{estargzconv.TOCDigestAnnotation: ann[estargzconv.TOCDigestAnnotation]}},
	)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	pcf, err := plain.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf.OS, cf.Architecture, cf.Config = pcf.OS, pcf.Architecture, pcf.Config
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	_, baseDigest, _ := layerOf(t, img, 0)
	reg.Push(t, "lazy/mixed:1", img)
	d, scope, before := lazyDaemon(t, berthdtest.Options{})
	ref := reg.Ref("lazy/mixed:1")
	pull(t, d, ref, nil)
	if m := lazyMountsBelow(t, d.Root); len(m) != 1 {
		t.Fatalf("lazy mounts: %q, want the top layer's only", m)
	}
	requireNoBlob(t, d, topDigest)
	if _, err := os.Stat(filepath.Join(d.Root, "images", "blobs", "sha256", strings.TrimPrefix(baseDigest, "sha256:"))); err != nil {
		t.Fatalf("plain base layer not downloaded: %v", err)
	}
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("container printed %q", got)
	}
	if _, err := d.Image.RemoveImage(ctxT(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// TestLazyPullOffPullsWhole: with image_lazy_pull.enable = false an
// eStargz image is pulled whole, as any other.
func TestLazyPullOffPullsWhole(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := testimages.EStargz(t, helloImage(t), "data/hello")
	reg.Push(t, "lazy/off:1", img)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.ImageLazyPull.Enable = false }})
	pull(t, d, reg.Ref("lazy/off:1"), nil)
	if m := lazyMountsBelow(t, d.Root); len(m) != 0 {
		t.Fatalf("lazy mounts with lazy pulling off: %q", m)
	}
	for i := range 2 {
		_, dg, _ := layerOf(t, img, i)
		if _, err := os.Stat(filepath.Join(d.Root, "images", "blobs", "sha256", strings.TrimPrefix(dg, "sha256:"))); err != nil {
			t.Fatalf("layer %s not downloaded: %v", dg, err)
		}
	}
}
