package container_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/shim"
)

// These tests run a container.Store over fakes (fakes_test.go): no root,
// no runc, no berth-shim.

func minimalSpec() *specs.Spec {
	return &specs.Spec{
		Process: &specs.Process{Args: []string{"true"}, User: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{5}}},
		Linux:   &specs.Linux{},
	}
}

// recordOnDisk reads a container's container.json.
func (u *unitStore) recordOnDisk(id string) *container.Container {
	u.t.Helper()
	data, err := os.ReadFile(filepath.Join(u.opts.Dir, id, "container.json"))
	if err != nil {
		u.t.Fatal(err)
	}
	var c container.Container
	if err := json.Unmarshal(data, &c); err != nil {
		u.t.Fatal(err)
	}
	return &c
}

func kinds(evs []container.Event) []container.EventKind {
	var out []container.EventKind
	for _, ev := range evs {
		out = append(out, ev.Kind)
	}
	return out
}

func ids(cs []*container.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

// A create goes through the whole pipeline: the record says what the
// config, the image, the volumes and the spec resolved to; the shim holds
// the container; leases and mounts are taken, and remove gives all back.
func TestUnitCreateRecordsWhatItResolved(t *testing.T) {
	u := newUnitStore(t)
	req := u.request("pod1", "web")
	req.LogPath = "/var/log/pods/p/web.log"
	req.Config.Mounts = []*runtime.Mount{
		{ContainerPath: "/data", HostPath: "/srv/data"},
		{ContainerPath: "/vol", Readonly: true, Image: &runtime.ImageSpec{Image: usr1Image}, ImageSubPath: "sub"},
	}
	req.Config.Linux = &runtime.LinuxContainerConfig{Resources: &runtime.LinuxContainerResources{CpuShares: 512}}
	c, err := u.create(req)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != container.StateCreated || c.ImageName != "busybox:latest" || c.ImageRef != "sha256:test" || c.Pid == 0 ||
		c.LogPath != req.LogPath || c.Resources.GetCpuShares() != 512 {
		t.Fatalf("record %+v", c)
	}
	if c.User == nil || c.User.UID != 1000 || !slices.Equal(c.User.Supplemental, []int64{5}) {
		t.Fatalf("user %+v", c.User)
	}
	vol := filepath.Join(u.opts.Dir, c.ID, "volumes", "1", "sub")
	if len(c.Mounts) != 2 || c.Mounts[0].HostPath != "/srv/data" || c.Mounts[1].HostPath != vol || c.Mounts[1].Image != usr1Image || c.Mounts[1].ImageSubPath != "sub" {
		t.Fatalf("mounts %+v", c.Mounts)
	}
	if !slices.Equal(c.VolumeOwners, []string{c.ID + ".vol1"}) {
		t.Fatalf("volume owners %v", c.VolumeOwners)
	}
	if owners, _ := u.images.Owners(); len(owners) != 2 {
		t.Fatalf("leases %v", owners)
	}
	if got := u.shims.holds("pod1"); !slices.Equal(got, []string{c.ID}) {
		t.Fatalf("shim holds %v", got)
	}
	if got := u.recordOnDisk(c.ID); got.State != container.StateCreated || got.ID != c.ID {
		t.Fatalf("record on disk %+v", got)
	}
	if _, err := os.Stat(filepath.Join(u.opts.Dir, c.ID, "config.json")); err != nil {
		t.Fatalf("bundle: %v", err)
	}

	removed, err := u.store.Remove(context.Background(), c.ID)
	if err != nil || removed == nil || removed.ID != c.ID {
		t.Fatalf("remove: %+v, %v", removed, err)
	}
	if owners, _ := u.images.Owners(); len(owners) != 0 {
		t.Fatalf("leases left %v", owners)
	}
	if left := u.mounts.left(); len(left) != 0 {
		t.Fatalf("mounts left %v", left)
	}
	if _, err := os.Stat(filepath.Join(u.opts.Dir, c.ID)); !os.IsNotExist(err) {
		t.Fatalf("container dir: %v", err)
	}
	if got := kinds(u.takeEvents()); !slices.Equal(got, []container.EventKind{container.EventCreated, container.EventDeleted}) {
		t.Fatalf("events %v", got)
	}
}

// A create that fails at any step leaves nothing: no mount, lease,
// directory, container on the monitor or idle pod there, and the name is
// free.
func TestUnitFailedCreateUndoesEverything(t *testing.T) {
	for name, setup := range map[string]func(u *unitStore, req *container.CreateRequest){
		"volume not readonly": func(_ *unitStore, req *container.CreateRequest) {
			req.Config.Mounts = []*runtime.Mount{{ContainerPath: "/vol", Image: &runtime.ImageSpec{Image: "busybox"}}}
		},
		"volume mount fails": func(u *unitStore, req *container.CreateRequest) {
			req.Config.Mounts = []*runtime.Mount{{ContainerPath: "/vol", Readonly: true, Image: &runtime.ImageSpec{Image: "busybox"}}}
			u.mounts.fail["volume"] = errors.New("no overlay for you")
		},
		// Prepare succeeds; the shim's create fails (below).
		"runtime create fails": func(*unitStore, *container.CreateRequest) {},
	} {
		t.Run(name, func(t *testing.T) {
			u := newUnitStore(t)
			req := u.request("pod1", "web")
			setup(u, &req)
			ctx := context.Background()
			d, err := u.store.Prepare(ctx, req)
			if err == nil {
				u.shims.failOp("create", d.ID, errors.New("runc says no"))
				spec := minimalSpec()
				_, err = d.Commit(ctx, spec, nil)
				d.Discard(ctx)
				d.Discard(ctx) // twice is fine
			}
			if err == nil {
				t.Fatal("create succeeded")
			}
			if owners, _ := u.images.Owners(); len(owners) != 0 {
				t.Fatalf("leases left %v", owners)
			}
			if left := u.mounts.left(); len(left) != 0 {
				t.Fatalf("mounts left %v", left)
			}
			if es, _ := os.ReadDir(u.opts.Dir); len(es) != 0 {
				t.Fatalf("container dirs left: %d", len(es))
			}
			if u.shims.running["pod1"] || len(u.shims.holds("pod1")) != 0 {
				t.Fatalf("the pod added to the monitor for the create stays (holds %v)", u.shims.holds("pod1"))
			}
			if len(u.store.List()) != 0 || len(u.takeEvents()) != 0 {
				t.Fatal("a failed create is listed or heard of")
			}
			u.mounts.fail = map[string]error{}
			u.shims.fail = map[string]map[string]error{}
			u.mustCreate("pod1", "web") // the name is free again
		})
	}
}

// Start's record write fails after the process started: the container is
// stopped and recorded exited (StartError) in memory and on disk, the
// error is returned, and listeners hear it stop, never start.
func TestUnitStartWhoseRecordFailsLeavesOneTruth(t *testing.T) {
	u := newUnitStore(t, fault.ContainerFailStartRecordWrite)
	c := u.mustCreate("pod1", "web")
	u.takeEvents()
	_, err := u.store.Start(context.Background(), c.ID)
	if !errors.Is(err, fault.ErrInjected) {
		t.Fatalf("start: %v, want the injected failure", err)
	}
	got, err := u.store.Get(c.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != container.StateExited || got.Reason != container.ReasonStart || !got.StartedAt.IsZero() {
		t.Fatalf("after the failed start: %+v", got)
	}
	if disk := u.recordOnDisk(c.ID); disk.State != container.StateExited || disk.Reason != container.ReasonStart {
		t.Fatalf("on disk: %+v", disk)
	}
	st, err := u.shims.Pod("pod1").State(context.Background(), c.ID)
	if err != nil || st.Status != shim.StatusExited {
		t.Fatalf("the process: %+v, %v; want it killed", st, err)
	}
	if got := kinds(u.takeEvents()); !slices.Equal(got, []container.EventKind{container.EventStopped}) {
		t.Fatalf("events %v, want only stopped", got)
	}
	// A restarted store agrees.
	u.restart()
	if s := u.state(c.ID); s != container.StateExited {
		t.Fatalf("after restart: %s", s)
	}
}

// Listeners hear Started only once the record says running, so a crash
// right after the event cannot make the disk contradict it.
func TestUnitStartedIsHeardAfterTheRecordSaysSo(t *testing.T) {
	u := newUnitStore(t)
	var onDisk container.State
	u.hook = func(ev container.Event) {
		if ev.Kind == container.EventStarted {
			onDisk = u.recordOnDisk(ev.Container.ID).State
		}
	}
	c := u.mustCreate("pod1", "web")
	u.mustStart(c.ID)
	if onDisk != container.StateRunning {
		t.Fatalf("record on disk said %q when Started was heard", onDisk)
	}
}

// RemovePod returns exactly what it removed: when one container cannot
// be removed the others are still removed and returned, the failure is
// reported, and the retry returns only the one that was left.
func TestUnitRemovePodReportsEachRemovalOnce(t *testing.T) {
	u := newUnitStore(t)
	ctx := context.Background()
	a, b, c := u.mustCreate("pod1", "a"), u.mustCreate("pod1", "b"), u.mustCreate("pod1", "c")
	other := u.mustCreate("pod2", "x")
	u.mustStart(a.ID)
	u.takeEvents()

	u.shims.failOp("delete", b.ID, errors.New("device busy"))
	removed, err := u.store.RemovePod(ctx, "pod1")
	if err == nil {
		t.Fatal("RemovePod hid a failed removal")
	}
	if got := ids(removed); !slices.Equal(got, []string{a.ID, c.ID}) {
		t.Fatalf("first RemovePod removed %v, want a and c", got)
	}
	if got := ids(u.store.ListPod("pod1")); !slices.Equal(got, []string{b.ID}) {
		t.Fatalf("left in the pod: %v, want b", got)
	}
	var deleted []string
	for _, ev := range u.takeEvents() {
		if ev.Kind == container.EventDeleted {
			deleted = append(deleted, ev.Container.ID)
		}
	}
	if !slices.Equal(deleted, []string{a.ID, c.ID}) {
		t.Fatalf("deleted events %v", deleted)
	}

	u.shims.failOp("delete", b.ID, nil)
	removed, err = u.store.RemovePod(ctx, "pod1")
	if err != nil || !slices.Equal(ids(removed), []string{b.ID}) {
		t.Fatalf("retry removed %v, %v; want b alone", ids(removed), err)
	}
	if removed, err = u.store.RemovePod(ctx, "pod1"); err != nil || len(removed) != 0 {
		t.Fatalf("a third RemovePod removed %v, %v", ids(removed), err)
	}
	if got := ids(u.store.List()); !slices.Equal(got, []string{other.ID}) {
		t.Fatalf("left: %v", got)
	}
	// A second Remove of a removed container is nothing, not a second removal.
	if r, err := u.store.Remove(ctx, a.ID); r != nil || err != nil {
		t.Fatalf("remove again: %+v, %v", r, err)
	}
}

// Every event lists all of the pod's containers as of the event (those
// recovered at start included), never another pod's, and a deleted
// container drops out. (Was cri's TestEventPublisherListsThePodsContainers,
// when the publisher kept its own copy of the records.)
func TestUnitEventsListThePodsContainers(t *testing.T) {
	u := newUnitStore(t)
	old := u.mustCreate("p1", "old")
	u.mustStart(old.ID)
	u.shims.exit("p1", old.ID, 0)
	u.mustCreate("p2", "x")
	u.restart() // old and x are now recovered, not created by this store
	if s := u.state(old.ID); s != container.StateExited {
		t.Fatalf("old is %s after restart", s)
	}
	u.takeEvents()

	c := u.mustCreate("p1", "new")
	u.mustStart(c.ID)
	if _, err := u.store.Remove(context.Background(), old.ID); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind  container.EventKind
		ids   []string
		state container.State
	}{
		{container.EventCreated, []string{old.ID, c.ID}, container.StateCreated},
		{container.EventStarted, []string{old.ID, c.ID}, container.StateRunning},
		{container.EventDeleted, []string{c.ID}, container.StateRunning},
	}
	evs := u.takeEvents()
	if len(evs) != len(want) {
		t.Fatalf("events %v", kinds(evs))
	}
	for i, w := range want {
		ev := evs[i]
		if ev.Kind != w.kind || !slices.Equal(ids(ev.Pod), w.ids) {
			t.Fatalf("event %d: %s listing %v, want %s listing %v (oldest first)", i, ev.Kind, ids(ev.Pod), w.kind, w.ids)
		}
		for _, p := range ev.Pod {
			if p.ID == c.ID && p.State != w.state {
				t.Fatalf("event %d: new is %s, want %s", i, p.State, w.state)
			}
		}
	}
}

// A create cut short after its image volumes were mounted and leased
// (berthd died before the record) is undone by the next start: mounts,
// directory and every lease of that container, and nothing else.
func TestUnitRecoveryUndoesACreateCutShort(t *testing.T) {
	u := newUnitStore(t)
	ctx := context.Background()
	kept := u.mustCreate("pod1", "kept")
	req := u.request("pod1", "cut")
	req.Config.Mounts = []*runtime.Mount{
		{ContainerPath: "/a", Readonly: true, Image: &runtime.ImageSpec{Image: "busybox"}},
		{ContainerPath: "/b", Readonly: true, Image: &runtime.ImageSpec{Image: "busybox"}},
	}
	d, err := u.store.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// Someone else's lease, not a container's: left alone.
	if _, _, err := u.images.Acquire(ctx, "busybox", "pinned-by-someone"); err != nil {
		t.Fatal(err)
	}
	// "berthd dies": the draft is neither committed nor discarded.
	u.restart()

	if _, err := os.Stat(filepath.Join(u.opts.Dir, d.ID)); !os.IsNotExist(err) {
		t.Fatalf("the cut create's dir: %v", err)
	}
	for _, m := range u.mounts.left() {
		if rel, _ := filepath.Rel(filepath.Join(u.opts.Dir, d.ID), m); filepath.IsLocal(rel) {
			t.Fatalf("mount left: %s", m)
		}
	}
	owners, _ := u.images.Owners()
	slices.Sort(owners)
	if want := []string{kept.ID, "pinned-by-someone"}; !slices.Equal(owners, want) {
		t.Fatalf("leases %v, want %v", owners, want)
	}
	if _, err := u.store.Get(d.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("the cut create is listed: %v", err)
	}
	u.mustCreate("pod1", "cut") // its name was never taken
}

// What CreateContainer and StartContainer record is fsynced after they
// return (decision 1600), so a power loss can leave a record older than
// the last reply, an empty one, or none; it also stops every container.
// A restarted berthd then lists the container with an older record as
// exited (unknown) and undoes the creates whose record is empty or
// missing: directory, mounts and leases.
func TestUnitRecoveryAfterAPowerLossBeforeTheRecordsWereFlushed(t *testing.T) {
	u := newUnitStore(t)
	u.opts.Deferred = atomicfile.NewDeferred(func(path string, err error) { t.Errorf("fsync %s: %v", path, err) })
	u.restart()
	older := u.mustCreate("pod1", "older")
	createdRecord, err := os.ReadFile(filepath.Join(u.opts.Dir, older.ID, "container.json"))
	if err != nil {
		t.Fatal(err)
	}
	u.mustStart(older.ID)
	empty := u.mustCreate("pod1", "empty")
	missing := u.mustCreate("pod2", "missing")
	u.opts.Deferred.Flush()
	u.store.Close()
	// The power goes: every container with it, and the last writes.
	u.shims.crash("pod1")
	u.shims.crash("pod2")
	for path, data := range map[string][]byte{
		filepath.Join(u.opts.Dir, older.ID, "container.json"):   createdRecord,
		filepath.Join(u.opts.Dir, empty.ID, "container.json"):   nil,
		filepath.Join(u.opts.Dir, empty.ID, "config.json"):      nil,
		filepath.Join(u.opts.Dir, missing.ID, "container.json"): nil,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(u.opts.Dir, missing.ID, "container.json")); err != nil {
		t.Fatal(err)
	}
	u.restart()

	got, err := u.store.Get(older.ID)
	if err != nil || got.State != container.StateExited || got.ExitCode != 255 || got.Reason != container.ReasonUnknown {
		t.Fatalf("container with an older record: %+v, %v; want exited 255 Unknown", got, err)
	}
	for _, c := range []*container.Container{empty, missing} {
		if _, err := u.store.Get(c.ID); !errdefs.IsNotFound(err) {
			t.Errorf("%s is listed: %v", c.Name, err)
		}
		if _, err := os.Stat(filepath.Join(u.opts.Dir, c.ID)); !os.IsNotExist(err) {
			t.Errorf("%s's dir: %v", c.Name, err)
		}
		for _, m := range u.mounts.left() {
			if rel, _ := filepath.Rel(filepath.Join(u.opts.Dir, c.ID), m); filepath.IsLocal(rel) {
				t.Errorf("mount left: %s", m)
			}
		}
	}
	if owners, _ := u.images.Owners(); !slices.Equal(owners, []string{older.ID}) {
		t.Errorf("leases %v, want only %s's", owners, older.Name)
	}
	u.mustCreate("pod1", "empty") // their names are free again
	u.mustCreate("pod2", "missing")
}

// A container whose shim died while berthd was down is exited (unknown)
// after a restart, and one that exited is recorded with its code.
func TestUnitRecoveryFoldsInWhatTheShimsSay(t *testing.T) {
	u := newUnitStore(t)
	done := u.mustCreate("pod1", "done")
	u.mustStart(done.ID)
	lost := u.mustCreate("pod2", "lost")
	u.mustStart(lost.ID)
	u.store.Close() // berthd goes down; meanwhile:
	u.shims.exit("pod1", done.ID, 3)
	u.shims.crash("pod2")
	u.restart()
	got, _ := u.store.Get(done.ID)
	if got.State != container.StateExited || got.ExitCode != 3 || got.Reason != container.ReasonError {
		t.Fatalf("exited while down: %+v", got)
	}
	got, _ = u.store.Get(lost.ID)
	if got.State != container.StateExited || got.ExitCode != 255 || got.Reason != container.ReasonUnknown {
		t.Fatalf("shim gone while down: %+v", got)
	}
	if _, ok := u.shims.running["pod2"]; ok {
		t.Fatal("the state of a pod no monitor serves was kept")
	}
}

// Status names the tag the pod asked for (the kubelet's
// user_specified_image) when the image has it among several tags of one
// digest, else the image's first tag; and the repo digest in the named
// tag's repository.
func TestUnitCreateRecordsTheAskedTag(t *testing.T) {
	u := newUnitStore(t)
	for _, tc := range []struct {
		asked, name, ref string
	}{
		{"registry.k8s.io/e2e/agnhost:2.66.1", "registry.k8s.io/e2e/agnhost:2.66.1", "registry.k8s.io/e2e/agnhost@sha256:" + strings.Repeat("2", 64)},
		{"example.com/agnhost:1", "example.com/agnhost:1", "example.com/agnhost@sha256:" + strings.Repeat("1", 64)},
		{"", "registry.k8s.io/e2e/agnhost:2.55", "registry.k8s.io/e2e/agnhost@sha256:" + strings.Repeat("2", 64)},
		{"registry.k8s.io/e2e/agnhost:2.0", "registry.k8s.io/e2e/agnhost:2.55", "registry.k8s.io/e2e/agnhost@sha256:" + strings.Repeat("2", 64)},
	} {
		req := u.request("pod1", "c"+strconv.Itoa(len(tc.asked)))
		req.Config.Image = &runtime.ImageSpec{Image: multiTagImageID, UserSpecifiedImage: tc.asked}
		c, err := u.create(req)
		if err != nil {
			t.Fatal(err)
		}
		if c.ImageName != tc.name || c.ImageRef != tc.ref || c.Image != multiTagImageID || c.ImageID != multiTagImageID {
			t.Errorf("asked %q: image %q, name %q, ref %q, id %q; want name %q, ref %q", tc.asked, c.Image, c.ImageName, c.ImageRef, c.ImageID, tc.name, tc.ref)
		}
	}
}
