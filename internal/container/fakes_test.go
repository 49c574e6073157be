package container_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/shim"
)

// The fakes below let a container.Store run without root, runc or
// berth-shim: fakeShims keeps each pod's containers as a shim would
// (processes that run until killed), fakeMounts makes directories where
// overlayfs would mount. Both outlive a Store, as shims and mounts outlive
// berthd.

type fakeCtr struct {
	status string
	pid    int
	exit   *shim.Exit
	done   chan struct{}
}

type fakeShims struct {
	mu       sync.Mutex
	running  map[string]bool                // pod → the monitor serves it
	ctrs     map[string]map[string]*fakeCtr // pod → ID → container
	fail     map[string]map[string]error    // op → container ID → error to answer
	nextPid  int
	launches int
}

func newFakeShims() *fakeShims {
	return &fakeShims{running: map[string]bool{}, ctrs: map[string]map[string]*fakeCtr{}, fail: map[string]map[string]error{}, nextPid: 1000}
}

// failOp makes op on container id fail with err (nil: succeed again).
func (f *fakeShims) failOp(op, id string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail[op] == nil {
		f.fail[op] = map[string]error{}
	}
	if err == nil {
		delete(f.fail[op], id)
		return
	}
	f.fail[op][id] = err
}

// exit makes a running container exit on its own with code.
func (f *fakeShims) exit(pod, id string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exitLocked(f.ctrs[pod][id], code)
}

func (f *fakeShims) exitLocked(c *fakeCtr, code int) {
	if c == nil || c.status == shim.StatusExited {
		return
	}
	c.status = shim.StatusExited
	c.exit = &shim.Exit{Pid: c.pid, Code: code, At: time.Now().UTC()}
	close(c.done)
}

// crash ends the pod (no monitor serves it any more) and kills every
// process in it.
func (f *fakeShims) crash(pod string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running[pod] = false
	for _, c := range f.ctrs[pod] {
		if c.status != shim.StatusExited {
			c.status = shim.StatusExited
			close(c.done)
		}
	}
	f.ctrs[pod] = nil
}

func (f *fakeShims) holds(pod string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.ctrs[pod] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (f *fakeShims) Pod(pod string) container.Shim { return &fakeShim{f: f, pod: pod} }

func (f *fakeShims) Start(_ context.Context, pod string) (container.Shim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[pod] {
		f.running[pod] = true
		f.launches++
	}
	return &fakeShim{f: f, pod: pod}, nil
}

func (f *fakeShims) Pods() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var pods []string
	for p := range f.running {
		pods = append(pods, p)
	}
	return pods, nil
}

func (f *fakeShims) StopIdleNode(context.Context) error { return nil }

func (f *fakeShims) Forget(pod string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.running, pod)
	delete(f.ctrs, pod)
	return nil
}

type fakeShim struct {
	f   *fakeShims
	pod string
}

// get returns the container under f.mu, or the error the op answers.
func (s *fakeShim) get(op, id string) (*fakeCtr, error) {
	if !s.f.running[s.pod] {
		return nil, shim.ErrNoShim
	}
	if err := s.f.fail[op][id]; err != nil {
		return nil, err
	}
	c := s.f.ctrs[s.pod][id]
	if c == nil {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

func (c *fakeCtr) state(id string) *shim.State {
	return &shim.State{ID: id, Pid: c.pid, Status: c.status, Exit: c.exit}
}

func (s *fakeShim) Create(_ context.Context, id string, cr *shim.CreateRequest) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if !s.f.running[s.pod] {
		return shim.ErrNoShim
	}
	if err := s.f.fail["create"][id]; err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(cr.Bundle, "config.json")); err != nil {
		return fmt.Errorf("no bundle: %w", err)
	}
	if s.f.ctrs[s.pod] == nil {
		s.f.ctrs[s.pod] = map[string]*fakeCtr{}
	}
	s.f.nextPid++
	s.f.ctrs[s.pod][id] = &fakeCtr{status: shim.StatusCreated, pid: s.f.nextPid, done: make(chan struct{})}
	return nil
}

func (s *fakeShim) Start(_ context.Context, id string) (*shim.State, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	c, err := s.get("start", id)
	if err != nil {
		return nil, err
	}
	c.status = shim.StatusRunning
	return c.state(id), nil
}

func (s *fakeShim) Kill(_ context.Context, id string, sig syscall.Signal, _ bool) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	c, err := s.get("kill", id)
	if err != nil {
		return err
	}
	if c.status == shim.StatusRunning {
		s.f.exitLocked(c, 128+int(sig))
	}
	return nil
}

func (s *fakeShim) State(_ context.Context, id string) (*shim.State, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	c, err := s.get("state", id)
	if err != nil {
		return nil, err
	}
	return c.state(id), nil
}

func (s *fakeShim) Wait(ctx context.Context, id string) (*shim.State, error) {
	s.f.mu.Lock()
	c, err := s.get("wait", id)
	s.f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if c.exit == nil {
		return nil, shim.ErrNoShim // the shim crashed
	}
	return c.state(id), nil
}

func (s *fakeShim) Delete(_ context.Context, id string) (*shim.State, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	c, err := s.get("delete", id)
	if err != nil {
		return nil, err
	}
	s.f.exitLocked(c, 137)
	delete(s.f.ctrs[s.pod], id)
	if len(s.f.ctrs[s.pod]) == 0 {
		// The pod ends with its last container.
		s.f.running[s.pod] = false
		delete(s.f.ctrs, s.pod)
	}
	return c.state(id), nil
}

func (s *fakeShim) ReopenLog(context.Context, string) error { return nil }

func (s *fakeShim) List(context.Context) ([]string, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if !s.f.running[s.pod] {
		return nil, shim.ErrNoShim
	}
	var ids []string
	for id := range s.f.ctrs[s.pod] {
		ids = append(ids, id)
	}
	return ids, nil
}

func (s *fakeShim) Shutdown(context.Context) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if !s.f.running[s.pod] {
		return shim.ErrNoShim
	}
	if len(s.f.ctrs[s.pod]) > 0 {
		return fmt.Errorf("shim holds containers: %w", errdefs.ErrFailedPrecondition)
	}
	s.f.running[s.pod] = false
	return nil
}

func (s *fakeShim) Attach(context.Context, string, bool, bool, bool) (*shim.Stream, error) {
	return nil, errors.New("fake shim: no attach")
}

func (s *fakeShim) Exit(id string) (*shim.Exit, bool, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if c := s.f.ctrs[s.pod][id]; c != nil && c.exit != nil {
		return c.exit, true, nil
	}
	return nil, false, nil
}

// fakeMounts stands in for overlayfs: a "mount" is a directory with a
// marker file, and what is mounted is tracked so a test can see leaks.
type fakeMounts struct {
	mu      sync.Mutex
	mounted map[string]bool // paths
	fail    map[string]error
}

func newFakeMounts() *fakeMounts {
	return &fakeMounts{mounted: map[string]bool{}, fail: map[string]error{}}
}

func (m *fakeMounts) mount(p, what string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail[what]; err != nil {
		return "", err
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", err
	}
	m.mounted[p] = true
	return p, nil
}

func (m *fakeMounts) Rootfs(dir string, _ []string, _ *container.UserNS) (string, error) {
	return m.mount(filepath.Join(dir, "rootfs"), "rootfs")
}

func (m *fakeMounts) ImageVolume(dir string, n int, _ []string, subPath string, _ *container.UserNS) (string, error) {
	p, err := m.mount(filepath.Join(dir, "volumes", fmt.Sprint(n)), "volume")
	if err != nil {
		return "", err
	}
	return filepath.Join(p, subPath), nil
}

func (m *fakeMounts) IDMapped(string, []*runtime.Mount, *container.UserNS) (map[string]string, error) {
	return nil, nil
}

func (m *fakeMounts) Unmount(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail["unmount"]; err != nil {
		return err
	}
	for p := range m.mounted {
		if rel, err := filepath.Rel(dir, p); err == nil && filepath.IsLocal(rel) {
			delete(m.mounted, p)
		}
	}
	return nil
}

func (m *fakeMounts) left() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for p := range m.mounted {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// unitStore is a container.Store over fakes, in a temporary directory.
type unitStore struct {
	t      *testing.T
	opts   container.Options
	store  *container.Store
	shims  *fakeShims
	mounts *fakeMounts
	images *layers

	mu     sync.Mutex
	events []container.Event
	// gen counts restarts: a Store left behind by restart (its watchers
	// still run here, unlike in a berthd that died) is no longer heard.
	gen int
	// hook, if set, also hears the current Store's events.
	hook func(container.Event)
}

func newUnitStore(t *testing.T, faults ...fault.Point) *unitStore {
	t.Helper()
	dir := t.TempDir()
	u := &unitStore{t: t, shims: newFakeShims(), mounts: newFakeMounts(), images: &layers{lower: filepath.Join(dir, "layer")}}
	var in *fault.Injector
	if len(faults) > 0 {
		var err error
		if in, err = fault.New(faults, nil); err != nil {
			t.Fatal(err)
		}
	}
	u.opts = container.Options{
		Dir:      filepath.Join(dir, "containers"),
		ShimDir:  filepath.Join(dir, "shims"),
		Runtimes: map[string]*oci.Runtime{"runc": oci.New("/bin/false", filepath.Join(dir, "runtime"), nil)},
		Images:   u.images,
		Shims:    u.shims,
		Mounter:  u.mounts,
		Faults:   in,
	}
	u.restart()
	t.Cleanup(func() {
		if u.store != nil {
			u.store.Close()
		}
	})
	return u
}

// restart opens a new Store over the same directories, shims and mounts,
// as a restarted berthd does.
func (u *unitStore) restart() {
	u.t.Helper()
	if u.store != nil {
		u.store.Close() // berthd dies: its watchers with it
	}
	u.mu.Lock()
	u.gen++
	gen := u.gen
	u.mu.Unlock()
	opts := u.opts
	opts.OnEvent = func(ev container.Event) {
		u.mu.Lock()
		current := gen == u.gen
		if current {
			u.events = append(u.events, ev)
		}
		hook := u.hook
		u.mu.Unlock()
		if current && hook != nil {
			hook(ev)
		}
	}
	s, err := container.Open(context.Background(), opts)
	if err != nil {
		u.t.Fatal(err)
	}
	u.store = s
}

func (u *unitStore) request(pod, name string) container.CreateRequest {
	return container.CreateRequest{
		PodID: pod, Runtime: "runc",
		Config: &runtime.ContainerConfig{
			Metadata: &runtime.ContainerMetadata{Name: name},
			Image:    &runtime.ImageSpec{Image: "busybox"},
			Labels:   map[string]string{"app": name},
		},
	}
}

func (u *unitStore) create(req container.CreateRequest) (*container.Container, error) {
	ctx := context.Background()
	d, err := u.store.Prepare(ctx, req)
	if err != nil {
		return nil, err
	}
	defer d.Discard(ctx)
	spec := minimalSpec()
	return d.Commit(ctx, spec, d.Record(spec).Resources)
}

func (u *unitStore) mustCreate(pod, name string) *container.Container {
	u.t.Helper()
	c, err := u.create(u.request(pod, name))
	if err != nil {
		u.t.Fatalf("create %s: %v", name, err)
	}
	return c
}

func (u *unitStore) mustStart(id string) {
	u.t.Helper()
	if _, err := u.store.Start(context.Background(), id); err != nil {
		u.t.Fatalf("start %s: %v", id, err)
	}
}

// takeEvents returns the events heard since the last call.
func (u *unitStore) takeEvents() []container.Event {
	u.mu.Lock()
	defer u.mu.Unlock()
	evs := u.events
	u.events = nil
	return evs
}

func (u *unitStore) state(id string) container.State {
	u.t.Helper()
	c, err := u.store.Get(id)
	if err != nil {
		u.t.Fatal(err)
	}
	return c.State
}
