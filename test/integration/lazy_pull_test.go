package integration

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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
	"github.com/berthcri/berth/internal/testutil/mounttest"
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
	return testimages.LayerBlob(t, img, i)
}

// rangeLog records the Range header of every GET of some blobs. With a
// hold, a GET of a whole blob (the background fetch) waits.
type rangeLog struct {
	mu     sync.Mutex
	ranges map[string][]string // digest → Range headers ("" for a whole GET)
	hold   *testimages.WholeHold
	gone   bool // every GET fails
}

// holdWhole makes whole-blob GETs wait until release or the test's end.
func (l *rangeLog) holdWhole(t *testing.T) { l.hold = testimages.NewWholeHold(t) }

func (l *rangeLog) release() {
	if l.hold != nil {
		l.hold.Release()
	}
}

func (l *rangeLog) setGone(gone bool) {
	l.mu.Lock()
	l.gone = gone
	l.mu.Unlock()
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
		if l.hold != nil && !l.hold.Wait(req) {
			return
		}
		l.mu.Lock()
		gone := l.gone
		l.mu.Unlock()
		if gone {
			// Not a 5xx: the registry client would retry those itself
			// for many seconds; the lazy layer's own retries are what
			// this tests.
			w.Header().Del("Content-Length")
			http.Error(w, "registry gone", http.StatusNotFound)
			return
		}
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

// blobPath is where d's store keeps the blob digest.
func blobPath(d *berthdtest.Daemon, digest string) string {
	return filepath.Join(d.Root, "images", "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

// requireNoBlob fails t if the blob digest is in d's store.
func requireNoBlob(t *testing.T, d *berthdtest.Daemon, digest string) {
	t.Helper()
	if blobStored(d, digest) {
		t.Fatalf("blob %s was downloaded whole", digest)
	}
}

// lazyImage is the lazy tests' all-eStargz image: busybox and
// lazyLayerFiles, with bin/busybox and data/hello prioritized.
func lazyImage(t *testing.T) v1.Image {
	t.Helper()
	return testimages.EStargz(t, buildImage(t, [][]testimages.File{lazyLayerFiles(t)}), "bin/busybox", "data/hello")
}

// lazyPulled is a lazyImage pushed as repo:1, its data layer (layer 1)
// served through log, and pulled by a lazy berthd.
type lazyPulled struct {
	reg        *testimages.Registry
	img        v1.Image
	dataDigest string
	log        *rangeLog
	d          *berthdtest.Daemon
	scope      leakcheck.Scope
	before     leakcheck.Snapshot
	ref        string
}

// pullLazy pushes a lazyImage as repo:1 and pulls it with a lazy berthd
// started with opts; hold makes the background fetch of the data layer
// wait (rangeLog.holdWhole).
func pullLazy(t *testing.T, repo string, hold bool, opts berthdtest.Options) *lazyPulled {
	t.Helper()
	p := &lazyPulled{reg: testimages.StartRegistry(t), img: lazyImage(t), log: &rangeLog{}}
	_, p.dataDigest, _ = layerOf(t, p.img, 1)
	if hold {
		p.log.holdWhole(t)
	}
	p.log.watch(t, p.reg, p.dataDigest, nil)
	p.reg.Push(t, repo+":1", p.img)
	p.d, p.scope, p.before = lazyDaemon(t, opts)
	p.ref = p.reg.Ref(repo + ":1")
	pull(t, p.d, p.ref, nil)
	return p
}

// removeSettled removes ref from d and checks that nothing is left
// beyond the before snapshot of scope.
func removeSettled(t *testing.T, d *berthdtest.Daemon, ref string, scope leakcheck.Scope, before leakcheck.Snapshot) {
	t.Helper()
	removeImage(t, d, ref)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// removeImage removes ref from d.
func removeImage(t *testing.T, d *berthdtest.Daemon, ref string) {
	t.Helper()
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
}

// lazyCtrEnv is a ctrEnv with a running pod named name whose CRI logs
// go under d's podlogs.
func lazyCtrEnv(t *testing.T, d *berthdtest.Daemon, reg *testimages.Registry, name string) *ctrEnv {
	t.Helper()
	e := &ctrEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	e.podCfg = podConfig(name)
	e.podCfg.LogDirectory = e.logDir
	e.podCfg.Linux.CgroupParent = ""
	e.pod = runPod(t, d, e.podCfg)
	return e
}

// logText is the CRI log at path as "stream: message" lines.
func logText(t *testing.T, path string) string {
	t.Helper()
	var out []string
	for _, rec := range readCRILog(t, path) {
		out = append(out, rec.stream+": "+rec.msg)
	}
	return strings.Join(out, "\n")
}

// TestLazyPullRunsBeforeTheLayerArrives pulls an all-eStargz image: each
// layer is mounted (FUSE) with its TOC and prioritized files fetched, no
// blob is downloaded whole, a container reads a prefetched file and one
// fetched on demand, and removing the image unmounts and removes it all.
func TestLazyPullRunsBeforeTheLayerArrives(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := lazyImage(t)
	var log rangeLog
	log.holdWhole(t) // the background fetch waits: the layers stay lazy
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
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 2 {
		t.Fatalf("lazy mounts after the pull: %q, want both layers", m)
	}
	for _, dg := range digests {
		requireNoBlob(t, d, dg)
	}
	// ImageStatus counts what is on disk: the config and the verified
	// chunks the lazy layers keep, not the blobs they do not have.
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(len(rawCfg))
	caches, _ := filepath.Glob(filepath.Join(d.Root, "images", "layers", "*", "cache", "*"))
	for _, c := range caches {
		if fi, err := os.Stat(c); err == nil {
			want += uint64(fi.Size())
		}
	}
	if st := imageStatus(t, d, ref); st == nil || st.Size != want {
		t.Fatalf("ImageStatus size %v, want %d (config and cached chunks)", st.GetSize(), want)
	}
	dataReqs := len(log.of(digests[1]))
	if got := catInPod(t, d, reg, ref, "/data/hello"); got != lazyHello {
		t.Fatalf("prefetched file: %q", got)
	}
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("file fetched on demand: %q", got)
	}
	if n := len(ranged(log.of(digests[1]))); n <= len(ranged(log.of(digests[1])[:dataReqs])) {
		t.Fatalf("reading /data/later made no range request (%d before, %d after)", dataReqs, n)
	}
	requireNoBlob(t, d, digests[1])
	removeImage(t, d, ref)
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 0 {
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
	img := lazyImage(t)
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
	// The background fetch would find the blob corrupt (its digest) on
	// its own; held, the corrupt chunk is found by the container's read.
	log.holdWhole(t)
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

	e := lazyCtrEnv(t, d, reg, "lazy-corrupt")
	cfg := e.config("cat", "sh", "-c", "cat /data/hello; cat /data/later")
	cfg.Image.Image = ref
	id := e.run(cfg)
	st := e.waitExited(id)
	joined := logText(t, st.LogPath)
	if st.ExitCode == 0 || !strings.Contains(joined, "stdout: "+lazyHello) || !strings.Contains(joined, "Input/output error") {
		t.Fatalf("exit %d, output:\n%s\nwant the prefetched file, then an I/O error", st.ExitCode, joined)
	}
	// Not kept: the image goes (the container keeps its layers meanwhile).
	lazyWait(t, func() bool { return imageStatus(t, d, ref) == nil })
	stopRemove(t, d, e.pod)
	lazyWait(t, func() bool { return len(mounttest.FUSEBelow(t, d.Root)) == 0 })
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	// Pulled again, it is fetched again (and is as corrupt).
	pull(t, d, ref, nil)
	removeImage(t, d, ref)
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
	var log rangeLog
	log.holdWhole(t)
	log.watch(t, reg, topDigest, nil)
	reg.Push(t, "lazy/mixed:1", img)
	d, scope, before := lazyDaemon(t, berthdtest.Options{})
	ref := reg.Ref("lazy/mixed:1")
	pull(t, d, ref, nil)
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 1 {
		t.Fatalf("lazy mounts: %q, want the top layer's only", m)
	}
	requireNoBlob(t, d, topDigest)
	if _, err := os.Stat(blobPath(d, baseDigest)); err != nil {
		t.Fatalf("plain base layer not downloaded: %v", err)
	}
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("container printed %q", got)
	}
	removeSettled(t, d, ref, scope, before)
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
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 0 {
		t.Fatalf("lazy mounts with lazy pulling off: %q", m)
	}
	for i := range 2 {
		_, dg, _ := layerOf(t, img, i)
		if _, err := os.Stat(blobPath(d, dg)); err != nil {
			t.Fatalf("layer %s not downloaded: %v", dg, err)
		}
	}
}

// ranged is the range requests of rs (not the whole-blob GETs).
func ranged(rs []string) []string {
	var out []string
	for _, r := range rs {
		if r != "" {
			out = append(out, r)
		}
	}
	return out
}

// blobStored reports whether d's store holds the blob digest.
func blobStored(d *berthdtest.Daemon, digest string) bool {
	_, err := os.Stat(blobPath(d, digest))
	return err == nil
}

// TestLazyPullBackgroundFetchCompletes: after a lazy pull the whole blob
// comes in the background (verified: digest and diff ID) and lands in
// the store; from then on the layer reads from disk, so a registry that
// is gone no longer matters to a container reading a file it never read.
func TestLazyPullBackgroundFetchCompletes(t *testing.T) {
	t.Parallel()
	p := pullLazy(t, "lazy/bg", false, berthdtest.Options{})
	reg, img, dataDigest, log, d, scope, before, ref := p.reg, p.img, p.dataDigest, p.log, p.d, p.scope, p.before, p.ref
	lazyWait(t, func() bool { return blobStored(d, dataDigest) })
	log.setGone(true)
	// Complete: ImageStatus counts the whole blob again.
	blob, _, _ := layerOf(t, img, 1)
	if st := imageStatus(t, d, ref); st == nil || st.Size < uint64(len(blob)) {
		t.Fatalf("ImageStatus size %v after the background fetch, want at least the %d bytes of the data layer", st.GetSize(), len(blob))
	}
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("read from the completed layer: %q", got)
	}
	removeSettled(t, d, ref, scope, before)
}

// TestLazyPullCompleteLayerReadsLocalFiles: once the background fetch
// has completed, each lazy layer writes its files out under its cache
// and drops its chunks (decision 3600, S3), and reads come from those
// files (FUSE passthrough where the kernel takes them, a read of the
// local file by the server otherwise). With the registry gone, a
// container runs busybox from them and reads the right bytes of a
// 512 KiB file, the host reads the same through the layer's mount,
// ImageStatus counts the blob and ImageFsInfo the files, and removing
// the image leaves nothing.
func TestLazyPullCompleteLayerReadsLocalFiles(t *testing.T) {
	t.Parallel()
	p := pullLazy(t, "lazy/local", false, berthdtest.Options{})
	reg, img, dataDigest, log, d, scope, before, ref := p.reg, p.img, p.dataDigest, p.log, p.d, p.scope, p.before, p.ref
	layerDirs, err := filepath.Glob(filepath.Join(d.Root, "images", "layers", "*", "lazy.json"))
	if err != nil || len(layerDirs) != 2 {
		t.Fatalf("lazy layers: %v, %v", layerDirs, err)
	}
	for i := range layerDirs {
		layerDirs[i] = filepath.Dir(layerDirs[i])
	}
	// The files are renamed into place first and the chunks dropped after
	// (a reader meanwhile may still fetch one): wait for both.
	filesOnly := func(l string) bool {
		e, err := os.ReadDir(filepath.Join(l, "cache"))
		return err == nil && len(e) == 1 && e[0].Name() == "files"
	}
	lazyWait(t, func() bool {
		for _, l := range layerDirs {
			if !filesOnly(l) {
				return false
			}
		}
		return blobStored(d, dataDigest)
	})
	log.setGone(true)

	filler := fileInLayer(t, img, 1, "data/filler")
	sum := sha256.Sum256(filler)
	want := hex.EncodeToString(sum[:]) + "  /data/filler"
	if got := shInPod(t, d, reg, ref, "sha256sum /data/filler"); got != want {
		t.Fatalf("container read %q, want %q", got, want)
	}
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("container read %q", got)
	}
	mounted, _ := filepath.Glob(filepath.Join(d.Root, "images", "layers", "*", "diff", "data", "filler"))
	if len(mounted) != 1 {
		t.Fatalf("data/filler in the lazy mounts: %v", mounted)
	}
	if got, err := os.ReadFile(mounted[0]); err != nil || !bytes.Equal(got, filler) {
		t.Fatalf("data/filler through the lazy mount: %d bytes, %v", len(got), err)
	}

	// The node's lazy-layer server writes the files out (decision 3600,
	// S4) and says so in its log.
	lazyWait(t, func() bool { return strings.Count(lazyServerLog(t, d), "lazy layer files local") == 2 })
	// Where the kernel takes the files for passthrough, the server answers
	// no read of them (internal/lazy's tests assert it with a probe).
	t.Logf("the server read local files for the kernel (no passthrough): %v", strings.Contains(lazyServerLog(t, d), "read through the FUSE server (not passed through"))

	blob, _, _ := layerOf(t, img, 1)
	if st := imageStatus(t, d, ref); st == nil || st.Size < uint64(len(blob)) {
		t.Fatalf("ImageStatus size %v, want at least the %d bytes of the data layer's blob", st.GetSize(), len(blob))
	}
	var files int64
	for _, l := range layerDirs {
		for _, e := range dirEntriesAt(t, filepath.Join(l, "cache", "files")) {
			if fi, err := os.Stat(filepath.Join(l, "cache", "files", e)); err == nil {
				files += fi.Size()
			}
		}
	}
	fs, err := d.Image.ImageFsInfo(berthdtest.Ctx(t), &criapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if used := fs.ImageFilesystems[0].UsedBytes.GetValue(); used < uint64(files+int64(len(blob))) {
		t.Fatalf("ImageFsInfo used %d bytes, less than the local files (%d) and the data blob (%d)", used, files, len(blob))
	}
	removeSettled(t, d, ref, scope, before)
}

// dirEntriesAt are the names in dir.
func dirEntriesAt(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// fileInLayer is the content of name in img's layer i.
func fileInLayer(t *testing.T, img v1.Image, i int, name string) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[i].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s not in layer %d: %v", name, i, err)
		}
		if strings.TrimPrefix(path.Clean(h.Name), "/") == name {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
}

// shInPod runs `sh -c script` from image ref in a new pod on d and
// returns what it printed; the pod is removed.
func shInPod(t *testing.T, d *berthdtest.Daemon, reg *testimages.Registry, ref, script string) string {
	t.Helper()
	return runInPod(t, d, reg, ref, "sh", "sh", "-c", script)
}

// TestLazyPullRegistryGoneMidFetch: the registry goes away after the
// pull. A container's read of a chunk never fetched retries, then fails
// with EIO (it does not hang); the background fetch retries with
// back-off; once the registry is back, the fetch completes and the same
// read works.
func TestLazyPullRegistryGoneMidFetch(t *testing.T) {
	t.Parallel()
	p := pullLazy(t, "lazy/gone", true, berthdtest.Options{Configure: func(c *config.Config) { c.ImageRangeFetch.Retries = 1 }})
	reg, dataDigest, log, d, scope, before, ref := p.reg, p.dataDigest, p.log, p.d, p.scope, p.before, p.ref
	// The TOC and the prefetch arrive; the background fetch is under way
	// (held) when the registry goes.
	lazyWait(t, func() bool { return slices.Contains(log.of(dataDigest), "") })
	log.setGone(true)
	log.release()

	e := lazyCtrEnv(t, d, reg, "lazy-gone")
	cfg := e.config("cat", "sh", "-c", "until cat /data/later; do sleep 1; done")
	cfg.Image.Image = ref
	id := e.run(cfg)
	// The first read fails with EIO while the registry is gone.
	lazyWait(t, func() bool {
		data, _ := os.ReadFile(e.status(id).LogPath)
		return strings.Contains(string(data), "Input/output error")
	})
	log.setGone(false)
	st := e.waitExited(id)
	if out := logText(t, st.LogPath); st.ExitCode != 0 || !strings.Contains(out, "stdout: "+lazyLater) {
		t.Fatalf("exit %d, output:\n%s", st.ExitCode, out)
	}
	lazyWait(t, func() bool { return blobStored(d, dataDigest) })
	stopRemove(t, d, e.pod)
	removeSettled(t, d, ref, scope, before)
}

// TestLazyPullImageRemovedWhileFetchRuns removes an image whose
// background fetch is stuck mid-blob: RemoveImage stops the fetch and
// waits for it, unmounts the layer, and leaves nothing (no ingest file,
// no mount).
func TestLazyPullImageRemovedWhileFetchRuns(t *testing.T) {
	t.Parallel()
	p := pullLazy(t, "lazy/rm", true, berthdtest.Options{})
	dataDigest, log, d, scope, before, ref := p.dataDigest, p.log, p.d, p.scope, p.before, p.ref
	lazyWait(t, func() bool { return slices.Contains(log.of(dataDigest), "") })
	removeImage(t, d, ref)
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 0 {
		t.Fatalf("lazy mounts after RemoveImage: %q", m)
	}
	if e := dirEntries(t, d, "ingest"); len(e) != 0 {
		t.Fatalf("ingest after RemoveImage: %v", e)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// lazyWait polls cond until it holds, failing t after 30 s. (Its own
// name: the shared poller is being renamed on main, waitFor → waitUntil.)
func lazyWait(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
