package container_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// layers stands in for image.Store's leases: it records Release calls.
type layers struct {
	lower    string
	mu       sync.Mutex
	held     map[string]bool
	released []string
}

func (l *layers) Acquire(_ context.Context, ref, owner string) (*image.Image, []string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = map[string]bool{}
	}
	l.held[owner] = true
	img := &image.Image{ID: "sha256:test", RepoTags: []string{"busybox:latest"}, Config: &ocispecv1.Image{}}
	if ref == usr1Image {
		img.Config.Config.StopSignal = "SIGUSR1"
	}
	if ref == multiTagImageID {
		img.ID = multiTagImageID
		img.RepoTags = []string{"registry.k8s.io/e2e/agnhost:2.55", "registry.k8s.io/e2e/agnhost:2.66.1", "example.com/agnhost:1"}
		img.RepoDigests = []string{"example.com/agnhost@sha256:" + strings.Repeat("1", 64), "registry.k8s.io/e2e/agnhost@sha256:" + strings.Repeat("2", 64)}
	}
	return img, []string{l.lower}, nil
}

func (l *layers) Release(owner string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, owner)
	l.released = append(l.released, owner)
	return nil
}

func (l *layers) Owners() ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for o := range l.held {
		out = append(out, o)
	}
	return out, nil
}

// usr1Image is an image whose config says SIGUSR1 stops it.
const usr1Image = "busybox-usr1"

// multiTagImageID is an image (asked for by ID, as the kubelet does) with
// three tags and two repo digests.
const multiTagImageID = "sha256:3333333333333333333333333333333333333333333333333333333333333333"

type fixture struct {
	t      *testing.T
	dir    string
	lower  string
	cgroup string
	layers *layers
	opts   container.Options
	store  *container.Store
	// exits receives every container's record as it stops.
	exits chan *container.Container
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	berthdtest.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc not installed")
	}
	dir, err := os.MkdirTemp("", "berth-ctrtest-")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, dir: dir, lower: filepath.Join(dir, "layer"), cgroup: "berthctrtest-" + filepath.Base(dir), exits: make(chan *container.Container, 100)}
	f.layers = &layers{lower: f.lower}
	t.Cleanup(func() {
		if err := berthdtest.CleanupNode(dir, f.cgroup); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	bundletest.WriteRootfs(t, f.lower)
	f.opts = container.Options{
		Dir:        filepath.Join(dir, "root", "containers"),
		ShimDir:    filepath.Join(dir, "state", "shims"),
		ShimBinary: bundletest.ShimBinary(t),
		Runtimes: map[string]*oci.Runtime{
			"runc":  oci.New("runc", filepath.Join(dir, "state", "runtime", "runc"), nil),
			"other": oci.New("runc", filepath.Join(dir, "state", "runtime", "other"), nil),
		},
		Images: f.layers,
		OnEvent: func(ev container.Event) {
			if ev.Kind == container.EventStopped {
				select {
				case f.exits <- ev.Container:
				default:
				}
			}
		},
	}
	f.open()
	return f
}

func (f *fixture) open() {
	f.t.Helper()
	s, err := container.Open(context.Background(), f.opts)
	if err != nil {
		f.t.Fatal(err)
	}
	// Closed before the node is cleaned up (cleanups run last first): a
	// store still watching would react to its monitor's kill (state,
	// delete, exit records) while the tree is being removed.
	f.t.Cleanup(s.Close)
	f.store = s
}

// createParams is one create as a test makes it: the request, and how the
// spec is built once the rootfs is mounted.
type createParams struct {
	container.CreateRequest
	BuildSpec func(id, rootfs string) (*specs.Spec, error)
}

func (f *fixture) params(pod, name string, args []string, edit func(*runtime.ContainerConfig, *specs.Spec)) createParams {
	cfg := &runtime.ContainerConfig{
		Metadata: &runtime.ContainerMetadata{Name: name},
		Image:    &runtime.ImageSpec{Image: "busybox"},
		Labels:   map[string]string{"app": name},
	}
	if edit != nil {
		edit(cfg, nil)
	}
	return createParams{
		CreateRequest: container.CreateRequest{
			PodID: pod, Runtime: "runc", Config: cfg,
			LogPath: filepath.Join(f.dir, "logs", pod, name+".log"),
		},
		BuildSpec: func(id, rootfs string) (*specs.Spec, error) {
			s := bundletest.Spec(rootfs, f.cgroup, id, args)
			if edit != nil {
				edit(nil, s)
			}
			return s, nil
		},
	}
}

// tryCreate runs the create pipeline: prepare, spec, commit.
func (f *fixture) tryCreate(ctx context.Context, p createParams) (*container.Container, error) {
	d, err := f.store.Prepare(ctx, p.CreateRequest)
	if err != nil {
		return nil, err
	}
	defer d.Discard(ctx)
	spec, err := p.BuildSpec(d.ID, d.Rootfs.Path)
	if err != nil {
		return nil, err
	}
	return d.Commit(ctx, spec, d.Record(spec).Resources)
}

func (f *fixture) create(pod, name string, args []string, edit func(*runtime.ContainerConfig, *specs.Spec)) *container.Container {
	f.t.Helper()
	c, err := f.tryCreate(context.Background(), f.params(pod, name, args, edit))
	if err != nil {
		f.t.Fatalf("create %s: %v", name, err)
	}
	return c
}

func (f *fixture) waitExited(id string) *container.Container {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := f.store.Get(id)
		if err != nil {
			f.t.Fatal(err)
		}
		if c.State == container.StateExited {
			return c
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("container %s still %s", id, c.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	mounts, err := berthdtest.MountsBelow(path)
	if err != nil {
		t.Fatal(err)
	}
	return len(mounts) > 0
}

func TestLifecycleExitCodesAndReasons(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	exits := f.exits
	ok := f.create("pod1", "ok", []string{"sh", "-c", "echo hi; touch /written"}, nil)
	bad := f.create("pod1", "bad", []string{"sh", "-c", "exit 7"}, nil)
	if ok.State != container.StateCreated || ok.CreatedAt.IsZero() {
		t.Fatalf("after create: %+v", ok)
	}
	for _, c := range []*container.Container{ok, bad} {
		if _, err := f.store.Start(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	got := f.waitExited(ok.ID)
	if got.ExitCode != 0 || got.Reason != container.ReasonCompleted || got.StartedAt.IsZero() || got.FinishedAt.Before(got.StartedAt) {
		t.Fatalf("ok: %+v", got)
	}
	got = f.waitExited(bad.ID)
	if got.ExitCode != 7 || got.Reason != container.ReasonError {
		t.Fatalf("bad: %+v", got)
	}
	// Both exits were announced once, with their final records.
	for i := 0; i < 2; i++ {
		select {
		case c := <-exits:
			if c.State != container.StateExited || c.Reason == "" {
				t.Fatalf("notified record %+v", c)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("exit not notified")
		}
	}
	// The writable layer took the write, the image layer did not.
	if _, err := os.Stat(filepath.Join(f.opts.Dir, ok.ID, "upper", "written")); err != nil {
		t.Fatalf("upper dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.lower, "written")); !os.IsNotExist(err) {
		t.Fatalf("write reached the lower dir: %v", err)
	}
	// Start is only for created containers.
	if _, err := f.store.Start(ctx, ok.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("start exited: %v", err)
	}
	// Stop of an exited container is a no-op.
	if err := f.store.Stop(ctx, ok.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*container.Container{ok, bad} {
		if _, err := f.store.Remove(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(f.opts.Dir, c.ID)); !os.IsNotExist(err) {
			t.Fatalf("container dir left: %v", err)
		}
	}
	if mounted(t, f.opts.Dir) {
		t.Fatal("mounts left after remove")
	}
	select {
	case c := <-exits:
		t.Fatalf("extra exit notification %+v", c)
	default:
	}
	if strings.Join(f.layers.released, ",") != ok.ID+","+bad.ID {
		t.Fatalf("released %v", f.layers.released)
	}
	// Missing IDs: stop and remove are fine, get is NotFound.
	if err := f.store.Stop(ctx, "nope", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Remove(ctx, "nope"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Get("nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	// The pod's last container is gone, so is its place on the monitor.
	waitGone(t, filepath.Join(f.opts.ShimDir, "pod1"))
}

func waitGone(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(dir); os.IsNotExist(err) && len(berthdtest.PidsMentioning(dir)) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there (pids %v)", dir, berthdtest.PidsMentioning(dir))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNameReservationAndFailedCreateUndoes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	c := f.create("pod1", "web", []string{"sleep", "100"}, nil)
	if _, err := f.tryCreate(ctx, f.params("pod1", "web", []string{"true"}, nil)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("same name: %v", err)
	}
	// Another pod or attempt is fine.
	other := f.create("pod2", "web", []string{"true"}, nil)
	// A spec the runtime refuses: everything is undone and the name is free.
	p := f.params("pod1", "broken", []string{"/no/such/binary"}, nil)
	if _, err := f.tryCreate(ctx, p); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("create broken: %v", err)
	}
	p = f.params("pod1", "broken", nil, nil)
	p.BuildSpec = func(string, string) (*specs.Spec, error) {
		return nil, errors.New("bad config: " + errdefs.ErrInvalidArgument.Error())
	}
	if _, err := f.tryCreate(ctx, p); err == nil {
		t.Fatal("create with failing spec succeeded")
	}
	// A pod whose first create fails keeps no shim.
	if _, err := f.tryCreate(ctx, f.params("pod3", "first", []string{"/no/such/binary"}, nil)); err == nil {
		t.Fatal("create with a missing binary succeeded")
	}
	waitGone(t, filepath.Join(f.opts.ShimDir, "pod3"))
	p.Runtime = "nope"
	if _, err := f.tryCreate(ctx, p); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown handler: %v", err)
	}
	entries, _ := os.ReadDir(f.opts.Dir)
	if len(entries) != 2 {
		t.Fatalf("container dirs after failed creates: %d, want 2", len(entries))
	}
	if len(f.layers.released) != 3 {
		t.Fatalf("released %v, want the three failed creates", f.layers.released)
	}
	mounts, _ := berthdtest.MountsBelow(f.opts.Dir)
	if len(mounts) != 2 {
		t.Fatalf("mounts %v, want the two live rootfs", mounts)
	}
	// Remove of a created (never started) container forces it.
	for _, x := range []*container.Container{c, other} {
		if _, err := f.store.Remove(ctx, x.ID); err != nil {
			t.Fatal(err)
		}
	}
	f.create("pod1", "web", []string{"true"}, nil) // name free again
}

func TestStopGracePeriodThenKill(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	// Ignores SIGTERM: only SIGKILL after the grace period ends it.
	stubborn := f.create("pod1", "stubborn", []string{"sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"}, nil)
	// Exits on its stop signal (SIGUSR1 here, as an image's StopSignal).
	polite := f.params("pod1", "polite", []string{"sh", "-c", "trap 'exit 0' USR1; while true; do sleep 0.1; done"}, nil)
	polite.Config.Image.Image = usr1Image
	pc, err := f.tryCreate(ctx, polite)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{stubborn.ID, pc.ID} {
		if _, err := f.store.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // let the traps be set
	start := time.Now()
	if err := f.store.Stop(ctx, stubborn.ID, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	got, _ := f.store.Get(stubborn.ID)
	if took < 2*time.Second || took > 8*time.Second || got.State != container.StateExited || got.ExitCode != 137 {
		t.Fatalf("stubborn stop took %s: %+v", took, got)
	}
	start = time.Now()
	if err := f.store.Stop(ctx, pc.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got, _ = f.store.Get(pc.ID)
	if time.Since(start) > 5*time.Second || got.ExitCode != 0 || got.Reason != container.ReasonCompleted {
		t.Fatalf("polite stop took %s: %+v", time.Since(start), got)
	}
	// Remove of a running container forces it.
	r := f.create("pod1", "running", []string{"sleep", "1000"}, nil)
	if _, err := f.store.Start(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Remove(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Get(r.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("removed container: %v", err)
	}
}

func TestReadonlyRootfs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	c := f.create("pod1", "ro", []string{"sh", "-c", "touch /x"}, func(cfg *runtime.ContainerConfig, _ *specs.Spec) {
		if cfg != nil {
			cfg.Linux = &runtime.LinuxContainerConfig{SecurityContext: &runtime.LinuxContainerSecurityContext{ReadonlyRootfs: true}}
		}
	})
	if _, err := f.store.Start(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	got := f.waitExited(c.ID)
	data, _ := os.ReadFile(got.LogPath)
	if got.ExitCode == 0 || !strings.Contains(string(data), "Read-only file system") {
		t.Fatalf("write to a read-only rootfs: %+v\n%s", got, data)
	}
}

func TestRecoveryAfterRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	long := f.create("pod1", "long", []string{"sleep", "1000"}, nil)
	short := f.create("pod1", "short", []string{"sh", "-c", "read x; exit 5"}, func(cfg *runtime.ContainerConfig, _ *specs.Spec) {
		if cfg != nil {
			cfg.Stdin, cfg.StdinOnce = true, true
		}
	})
	created := f.create("pod1", "created", []string{"true"}, nil)
	for _, id := range []string{long.ID, short.ID} {
		if _, err := f.store.Start(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// "berthd goes down": drop the store. Meanwhile short exits.
	f.store = nil
	s, err := shimAttachClose(f, "pod1", short.ID)
	if err != nil {
		t.Fatal(err)
	}
	_ = s
	time.Sleep(500 * time.Millisecond)
	f.open()
	got, err := f.store.Get(short.ID)
	if err != nil || got.State != container.StateExited || got.ExitCode != 5 {
		t.Fatalf("short after restart: %+v %v", got, err)
	}
	got, _ = f.store.Get(long.ID)
	if got.State != container.StateRunning {
		t.Fatalf("long after restart: %+v", got)
	}
	got, _ = f.store.Get(created.ID)
	if got.State != container.StateCreated {
		t.Fatalf("created after restart: %+v", got)
	}
	if _, err := f.tryCreate(ctx, f.params("pod1", "long", []string{"true"}, nil)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("names not recovered: %v", err)
	}
	// A container created before the restart starts after it.
	if _, err := f.store.Start(ctx, created.ID); err != nil {
		t.Fatal(err)
	}
	if got := f.waitExited(created.ID); got.ExitCode != 0 || got.Reason != container.ReasonCompleted {
		t.Fatalf("created-then-started after restart: %+v", got)
	}
	if err := f.store.Stop(ctx, long.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.RemovePod(ctx, "pod1"); err != nil {
		t.Fatal(err)
	}
	if n := len(f.store.List()); n != 0 {
		t.Fatalf("%d containers left", n)
	}
	waitGone(t, filepath.Join(f.opts.ShimDir, "pod1"))
}

func TestAttachStdinAndOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	c := f.create("pod1", "cat", []string{"sh", "-c", "cat; echo done >&2"}, func(cfg *runtime.ContainerConfig, _ *specs.Spec) {
		if cfg != nil {
			cfg.Stdin, cfg.StdinOnce = true, true
		}
	})
	if _, err := f.store.Start(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	err := f.store.Attach(ctx, c.ID, strings.NewReader("hello through attach\n"), &out, &errOut, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello through attach\n" || errOut.String() != "done\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errOut.String())
	}
	if got := f.waitExited(c.ID); got.ExitCode != 0 {
		t.Fatalf("exit %+v", got)
	}
	if err := f.store.Attach(ctx, c.ID, nil, &out, nil, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("attach to exited: %v", err)
	}
}

func TestShimKilledMarksContainersLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	c := f.create("pod1", "victim", []string{"sleep", "1000"}, nil)
	if _, err := f.store.Start(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	// The node's keeper, then its monitor (killed alone, the monitor
	// would be restarted and lose nothing: decision 1701).
	nodeDir := proto.NodeDir(f.opts.ShimDir) + "\x00"
	for _, mode := range []string{"keeper", "monitor"} {
		for _, pid := range berthdtest.PidsMentioning(nodeDir) {
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "\x00"+mode+"\x00") {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	got := f.waitExited(c.ID)
	if got.Reason != container.ReasonUnknown || got.ExitCode != 255 || got.Message == "" {
		t.Fatalf("after shim kill: %+v", got)
	}
	// Remove still cleans up: the runtime kills and forgets the orphan.
	if _, err := f.store.Remove(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("runc", "--root", f.opts.Runtimes["runc"].Root, "state", c.ID).CombinedOutput(); err == nil {
		t.Fatalf("runc still knows the container: %s", out)
	}
	if mounted(t, f.opts.Dir) {
		t.Fatal("rootfs still mounted")
	}
}
