package security

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/mounttest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Lazy layers (decision 3600): their FUSE mounts, their dirs, the
// node.sock that carries their /dev/fuse fds and the lazy.sock berthd
// answers their range requests on are root's only.

// lazyContent is /data/hello of pushLazy's image: 0644, readable by
// anyone who reaches it.
const lazyContent = "a file of a lazily pulled layer"

// lazyConfigure turns lazy pulling on (the default, decision 3600)
// and opens the scratch dir above root and state to traversal, as /var/lib
// is on a node: a host user's EACCES then comes from berth's own modes,
// not from the test's 0700 scratch dir.
func lazyConfigure(t *testing.T) func(*config.Config) {
	return func(c *config.Config) {
		c.ImageLazyPull.Enable = true
		if err := os.Chmod(filepath.Dir(c.Root), 0o711); err != nil {
			t.Fatal(err)
		}
	}
}

// pushLazy pushes to reg, as repoTag, an all-eStargz image of busybox and
// a data layer holding /data/hello, and returns its reference. Whole GETs
// of every layer wait until the test ends, so both stay lazy (their
// chunks come by range requests, through lazy.sock) and their dirs do
// not change under the test: a layer that completes writes its files
// out and drops its chunk cache.
func pushLazy(t *testing.T, reg *testimages.Registry, repoTag string) string {
	t.Helper()
	img, err := testimages.Build([][]testimages.File{{
		{Name: "data", Dir: true, Mode: 0o755},
		{Name: "data/hello", Mode: 0o644, Data: []byte(lazyContent + "\n")},
	}}, v1.Config{Cmd: []string{"sh"}})
	img = testimages.EStargz(t, testimages.Must(t, img, err), "bin/busybox")
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var digests []string
	for _, layer := range layers {
		dg, err := layer.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, dg.String())
	}
	reg.HoldWhole(t, digests...)
	reg.Push(t, repoTag, img)
	return reg.Ref(repoTag)
}

// lazyServerPids are the berth-lazy processes of the berthd whose state
// dir is state.
func lazyServerPids(state string) []int {
	var pids []int
	for _, pid := range berthdtest.PidsMentioning(state) {
		if comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); strings.TrimSpace(string(comm)) == "berth-lazy" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitUntil polls cond until it holds; a test's deadline bounds it.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after a minute", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A lazily pulled layer is served by FUSE (allow_other,
// default_permissions: the TOC's modes apply, and /data/hello is 0644),
// so what keeps a host user from reading it is the path to it: the
// layer's dir and its mount are below 0700 directories. A host user
// (nobody) gets EACCES on the file through the mount and on every file
// of the layer dir (TOC, chunk cache, lazy.json), while root reads them;
// a container of the image reads its file and sees no /dev/fuse (nor
// gets one by mknod), no lazy.sock and no node.sock.
func TestLazyLayerClosedToHostUsersAndContainers(t *testing.T) {
	e := startPhEnv(t, berthdtest.Options{Configure: lazyConfigure(t)})
	ref := pushLazy(t, e.reg, "lazy/sec:1")
	// A first pod makes what stays (the node's dirs, CNI's state).
	ns := &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER}
	_, warmID := e.runPod(t, "lazy-warmup", ns)
	removePod(t, e.d, warmID)
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	before := leakcheck.Take(t, scope)

	if _, err := e.d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	mounts := mounttest.FUSEBelow(t, e.d.Root)
	if len(mounts) != 2 {
		t.Fatalf("lazy mounts after the pull: %q, want both layers'", mounts)
	}
	// The scratch dir and root let nobody through (lazyConfigure): what
	// refuses below is berth's.
	if err := asUser(socketNobody, socketNobody, func() error { var st unix.Stat_t; return unix.Stat(e.d.Root, &st) }); err != nil {
		t.Fatalf("nobody cannot reach %s itself: %v; the test would prove nothing", e.d.Root, err)
	}
	var file string
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join(m, "data", "hello")); err == nil {
			file = filepath.Join(m, "data", "hello")
		}
	}
	if file == "" {
		t.Fatalf("no lazy mount of %q holds data/hello", mounts)
	}
	if got, err := os.ReadFile(file); err != nil || strings.TrimSpace(string(got)) != lazyContent {
		t.Fatalf("root reading %s: %q, %v", file, got, err)
	}
	if err := openAs(socketNobody, socketNobody, file); !errors.Is(err, unix.EACCES) {
		t.Errorf("nobody opening %s through the lazy mount: %v, want EACCES", file, err)
	}
	// Every file of the layers' dirs but their mounts.
	files := 0
	for _, m := range mounts {
		dir := filepath.Dir(m)
		_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err != nil || slices.Contains(mounts, p) {
				return fs.SkipDir
			}
			if !de.Type().IsRegular() {
				return nil
			}
			files++
			if err := openAs(0, 0, p); err != nil {
				t.Errorf("root opening %s: %v", p, err)
			}
			if err := openAs(socketNobody, socketNobody, p); !errors.Is(err, unix.EACCES) {
				t.Errorf("nobody opening %s: %v, want EACCES", p, err)
			}
			return nil
		})
	}
	if files == 0 {
		t.Fatalf("no file in the layer dirs of %q: the test sees nothing", mounts)
	}

	// A container of the lazy image.
	pod, podID := e.runPod(t, "lazy-sec", ns)
	ctr := e.container("lazy", ns)
	ctr.Image.Image = ref
	id := e.runContainer(t, podID, pod, ctr)
	if out, code := e.sh(t, id, "cat /data/hello"); code != 0 || strings.TrimSpace(out) != lazyContent {
		t.Fatalf("the container reading its lazy file: exit %d, %q", code, out)
	}
	if n := len(lazyServerPids(e.d.State)); n == 0 {
		t.Fatalf("no berth-lazy serves the layers")
	}
	var nodeSock string
	_ = filepath.WalkDir(e.d.State, func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.Type() == fs.ModeSocket && de.Name() == "node.sock" {
			nodeSock = p
		}
		return nil
	})
	if nodeSock == "" {
		t.Fatalf("no node.sock below %s", e.d.State)
	}
	for _, p := range []string{"/dev/fuse", filepath.Join(e.d.Root, "lazy.sock"), nodeSock, filepath.Dir(mounts[0])} {
		if out, code := e.sh(t, id, "ls -l "+p+" 2>&1; test -e "+p); code == 0 {
			t.Errorf("the container sees %s: %q", p, out)
		}
	}
	// Nor does it make itself a FUSE connection: the device cgroup
	// refuses the open of a node it made (if it may make one at all).
	if out, _ := e.sh(t, id, "mknod /tmp/fuse c 10 229 2>&1; (exec 3</tmp/fuse && echo OPENED) 2>&1"); strings.Contains(out, "OPENED") {
		t.Errorf("the container opened /dev/fuse's device by mknod: %q", out)
	}

	removePod(t, e.d, podID)
	if _, err := e.d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lazy mounts and berth-lazy to go", func() bool {
		return len(mounttest.FUSEBelow(t, e.d.Root)) == 0 && len(lazyServerPids(e.d.State)) == 0
	})
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}

// removePod stops and removes the pod id.
func removePod(t *testing.T, d *berthdtest.Daemon, id string) {
	t.Helper()
	if _, err := d.Runtime.StopPodSandbox(berthdtest.Ctx(t), &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.RemovePodSandbox(berthdtest.Ctx(t), &criapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
}
