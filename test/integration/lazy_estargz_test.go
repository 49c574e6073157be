package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/image/estargzconv"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Lazy pulling (issue 36, decision 3600), stage S1: eStargz images made
// the way users make them, pulled whole as today.

// lazyHello is what the eStargz test image's /data/hello says.
const lazyHello = "hello from an eStargz layer"

// helloImage is busybox plus a layer with /data/hello.
func helloImage(t *testing.T) v1.Image {
	t.Helper()
	return buildImage(t, [][]testimages.File{{
		{Name: "data", Dir: true},
		{Name: "data/hello", Data: []byte(lazyHello + "\n")},
	}})
}

// requireEStargzLayers fails t unless every layer descriptor of the
// manifest names its TOC digest.
func requireEStargzLayers(t *testing.T, raw []byte) {
	t.Helper()
	var m v1.Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	if len(m.Layers) == 0 {
		t.Fatal("manifest has no layers")
	}
	for _, l := range m.Layers {
		if !strings.HasPrefix(l.Annotations[estargzconv.TOCDigestAnnotation], "sha256:") {
			t.Fatalf("layer %s has no TOC digest annotation: %v", l.Digest, l.Annotations)
		}
	}
}

// lazyDaemon is a berthd whose node is warmed up (bridge, IPAM files
// made by a first pod), with its store's leak scope and a snapshot of it.
func lazyDaemon(t *testing.T, opts berthdtest.Options) (*berthdtest.Daemon, leakcheck.Scope, leakcheck.Snapshot) {
	t.Helper()
	// Lazy pulling is off by default until its layers outlive berthd
	// (decision 3600): these tests turn it on, then apply their own.
	configure := opts.Configure
	opts.Configure = func(c *config.Config) {
		c.ImageLazyPull.Enable = true
		if configure != nil {
			configure(c)
		}
	}
	d := berthdtest.Start(t, opts)
	stopRemove(t, d, runPod(t, d, podConfig("warmup-"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))))
	scope, before := storeLeakScope(t, d)
	return d, scope, before
}

// catInPod runs `cat path` from image ref in a new pod on d and returns
// what it printed; the pod is removed.
func catInPod(t *testing.T, d *berthdtest.Daemon, reg *testimages.Registry, ref, path string) string {
	t.Helper()
	return runInPod(t, d, reg, ref, ref+path, "cat", path)
}

// runInPod runs argv from image ref in a new pod on d and returns what it
// printed; the pod is removed. A pod and log directory of its own per
// call (named for the test and tag): CRI logs outlive pods.
func runInPod(t *testing.T, d *berthdtest.Daemon, reg *testimages.Registry, ref, tag string, argv ...string) string {
	t.Helper()
	name := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + strings.NewReplacer("/", "-", ".", "-", ":", "-").Replace(tag)
	name = name[max(0, len(name)-60):]
	e := &ctrEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs", name)}
	e.podCfg = podConfig(strings.Trim(name, "-"))
	e.podCfg.LogDirectory = e.logDir
	e.podCfg.Linux.CgroupParent = ""
	e.pod = runPod(t, d, e.podCfg)
	cfg := e.config(argv[0], argv...)
	cfg.Image.Image = ref
	lines, st := e.output(cfg)
	if st.ExitCode != 0 {
		t.Fatalf("%q in %s exited %d: %q", argv, ref, st.ExitCode, lines)
	}
	stopRemove(t, d, e.pod)
	return strings.Join(lines, "\n")
}

// TestLazyEStargzImagePullsWholeAndRuns pulls an eStargz image (made by
// the converter berthctl uses) through a berthd with lazy pulling off:
// it is valid gzip, so the pull stores it whole as today, the stored manifest keeps the TOC
// annotations, a container reads a prioritized file, and removing the
// image leaves nothing.
func TestLazyEStargzImagePullsWholeAndRuns(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := testimages.EStargz(t, helloImage(t), "bin/busybox", "data/hello")
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	requireEStargzLayers(t, raw)
	reg.Push(t, "lazy/hello:1", img)
	d, scope, before := lazyDaemon(t, berthdtest.Options{Configure: func(c *config.Config) { c.ImageLazyPull.Enable = false }})

	ref := reg.Ref("lazy/hello:1")
	if id := pull(t, d, ref, nil); id != configDigest(t, img) {
		t.Fatalf("pulled %s, want %s", id, configDigest(t, img))
	}
	md, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(filepath.Join(d.Root, "images", "blobs", "sha256", md.Hex))
	if err != nil {
		t.Fatalf("stored manifest: %v", err)
	}
	requireEStargzLayers(t, stored)
	for _, l := range requireLayers(t, img) {
		if _, err := os.Stat(filepath.Join(d.Root, "images", "blobs", "sha256", l.Digest.Hex)); err != nil {
			t.Fatalf("layer %s not stored whole: %v", l.Digest, err)
		}
	}
	if got := catInPod(t, d, reg, ref, "/data/hello"); got != lazyHello {
		t.Fatalf("container printed %q, want %q", got, lazyHello)
	}
	removeSettled(t, d, ref, scope, before)
}

// TestBerthctlImageConvertEStargz converts with `berthctl image convert
// --estargz` from a registry to a registry, from berthd's store to a
// registry and from a registry into the store: each result has a TOC per
// layer, keeps the source's config, and runs.
func TestBerthctlImageConvertEStargz(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	src := helloImage(t)
	reg.Push(t, "plain/hello:1", src)
	d, scope, before := lazyDaemon(t, berthdtest.Options{})
	addr := "unix://" + d.Socket

	convert := func(srcRef, dstRef string) {
		t.Helper()
		out, code := runBerthctl(t, "--address", addr, "image", "convert", "--estargz", "--prioritize", "bin/busybox,data/hello,no/such/file", srcRef, dstRef)
		if code != 0 {
			t.Fatalf("berthctl image convert %s %s exited %d:\n%s", srcRef, dstRef, code, out)
		}
		if !strings.Contains(out, "warning: no/such/file is in no layer") || !strings.Contains(out, "converted "+srcRef+" to "+dstRef+"@sha256:") {
			t.Fatalf("berthctl image convert said:\n%s", out)
		}
	}
	remoteManifest := func(ref string) []byte {
		t.Helper()
		r, err := name.ParseReference(ref, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Get(r)
		if err != nil {
			t.Fatalf("get %s: %v", ref, err)
		}
		return desc.Manifest
	}
	srcCfg, err := src.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}

	// Registry to registry.
	convert(reg.Ref("plain/hello:1"), reg.Ref("esgz/hello:1"))
	requireEStargzLayers(t, remoteManifest(reg.Ref("esgz/hello:1")))
	r, err := name.ParseReference(reg.Ref("esgz/hello:1"), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	conv, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := conv.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Cmd, " ") != strings.Join(srcCfg.Config.Cmd, " ") || len(cf.History) != len(srcCfg.History) || len(cf.RootFS.DiffIDs) != len(srcCfg.RootFS.DiffIDs) {
		t.Fatalf("converted config %+v, source %+v", cf, srcCfg)
	}

	// Store to registry: the plain image pulled into berthd, converted
	// from there.
	plainRef := reg.Ref("plain/hello:1")
	pull(t, d, plainRef, nil)
	convert("store:"+plainRef, reg.Ref("esgz/fromstore:1"))
	requireEStargzLayers(t, remoteManifest(reg.Ref("esgz/fromstore:1")))

	// Registry into the store, imported as an OCI layout: the manifest
	// berthd stored keeps the annotations, and a container runs on it.
	local := reg.Host + "/esgz/imported:1"
	convert(reg.Ref("esgz/hello:1"), "store:"+local)
	st := imageStatus(t, d, local)
	if st == nil {
		t.Fatalf("%s not in the store after the conversion", local)
	}
	if got := catInPod(t, d, reg, local, "/data/hello"); got != lazyHello {
		t.Fatalf("container printed %q, want %q", got, lazyHello)
	}
	for _, ref := range []string{plainRef, local} {
		removeImage(t, d, ref)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))

	// Bad input: a refusal with a reason, nothing converted.
	for _, args := range [][]string{
		{"image", "convert", reg.Ref("plain/hello:1"), reg.Ref("x/y:1")}, // no format
		{"image", "convert", "--estargz", reg.Ref("plain/hello:1")},      // no DST
	} {
		if out, code := runBerthctl(t, append([]string{"--address", addr}, args...)...); code != 2 {
			t.Fatalf("berthctl %q exited %d, want 2 (usage):\n%s", args, code, out)
		}
	}
	if out, code := runBerthctl(t, "--address", addr, "image", "convert", "--estargz", "--max-layer-size", "1024", reg.Ref("plain/hello:1"), reg.Ref("x/big:1")); code != 1 || !strings.Contains(out, "over the size limit") {
		t.Fatalf("a layer over --max-layer-size: exit %d:\n%s", code, out)
	}
}

// requireLayers is img's layer descriptors.
func requireLayers(t *testing.T, img v1.Image) []v1.Descriptor {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	return m.Layers
}

// buildImage is busybox with extra layers, its command sh.
func buildImage(t *testing.T, extra [][]testimages.File) v1.Image {
	t.Helper()
	img, err := testimages.Build(extra, v1.Config{Cmd: []string{"sh"}})
	return testimages.Must(t, img, err)
}
