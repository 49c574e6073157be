package cgroupctrl

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A host shaped like the development machine: v1 hybrid, the hugetlb
// controller compiled in (and offered by the unified tree) but no v1
// hierarchy mounted for it below /sys/fs/cgroup, where a
// /sys/fs/cgroup/hugetlb directory may exist (Detect never looks at
// directories), and one mounted elsewhere, where runc does not look.
func TestDetectV1HugetlbDirectoryWithoutAMountIsMissing(t *testing.T) {
	c, err := Detect(Options{MountInfo: "testdata/mountinfo-v1-no-hugetlb", Parent: "/berth"})
	if err != nil {
		t.Fatal(err)
	}
	if c.V2 || !c.Hybrid || c.Version() != "v1 (hybrid)" {
		t.Fatalf("version: %+v", c)
	}
	want := []string{"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "memory", "pids"}
	if !reflect.DeepEqual(c.Available, want) {
		t.Fatalf("available = %v, want %v", c.Available, want)
	}
	if c.Has("hugetlb") {
		t.Fatal("hugetlb taken as present from a directory")
	}
	if m := c.MissingRequired(); len(m) != 0 {
		t.Fatalf("missing required: %v", m)
	}
	var names []string
	for _, m := range c.MissingOptional() {
		names = append(names, m.Controller)
	}
	if !reflect.DeepEqual(names, []string{"hugetlb", "rdma", "net_cls", "net_prio"}) {
		t.Fatalf("missing optional = %v", names)
	}
}

func TestDetectV1HugetlbMounted(t *testing.T) {
	c, err := Detect(Options{MountInfo: "testdata/mountinfo-v1-hugetlb"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"hugetlb", "net_cls", "net_prio"} {
		if !c.Has(n) {
			t.Fatalf("%s not found in %v", n, c.Available)
		}
	}
	if slices.ContainsFunc(c.MissingOptional(), func(m Missing) bool { return m.Controller == "hugetlb" }) {
		t.Fatal("hugetlb reported missing")
	}
	r := &specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 0}}}
	if d := c.Drop(r); len(d) != 0 || len(r.HugepageLimits) != 1 {
		t.Fatalf("dropped %v, left %+v", d, r.HugepageLimits)
	}
}

func TestDetectV2ReadsTheParentsControllers(t *testing.T) {
	root := t.TempDir()
	write := func(dir, ctrls string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, "cgroup.controllers"), []byte(ctrls+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("", "cpuset cpu io memory hugetlb pids rdma misc")
	write("kubepods.slice", "cpuset cpu io memory pids")
	mi := filepath.Join(t.TempDir(), "mountinfo")
	data, err := os.ReadFile("testdata/mountinfo-v2")
	if err != nil {
		t.Fatal(err)
	}
	// The fixture mounts cgroup2 on /sys/fs/cgroup; point it at root.
	data = []byte(strings.ReplaceAll(string(data), "/sys/fs/cgroup", root))
	if err := os.WriteFile(mi, data, 0o644); err != nil {
		t.Fatal(err)
	}

	// A slice delegated without hugetlb, rdma and misc.
	c, err := Detect(Options{MountInfo: mi, Root: root, Parent: "/kubepods.slice"})
	if err != nil {
		t.Fatal(err)
	}
	if !c.V2 || c.Source != filepath.Join(root, "kubepods.slice", "cgroup.controllers") {
		t.Fatalf("%+v", c)
	}
	if c.Has("hugetlb") || !c.Has("memory") {
		t.Fatalf("available = %v", c.Available)
	}
	r := &specs.LinuxResources{
		HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB"}, {Pagesize: "1GB"}},
		Unified:        map[string]string{"hugetlb.2MB.max": "0", "misc.max": "x 1", "memory.high": "100M"},
		Pids:           &specs.LinuxPids{Limit: new(int64)},
	}
	dropped := c.Drop(r)
	if !reflect.DeepEqual(dropped, []string{"hugetlb", "misc"}) {
		t.Fatalf("dropped = %v", dropped)
	}
	if r.HugepageLimits != nil || !reflect.DeepEqual(r.Unified, map[string]string{"memory.high": "100M"}) || r.Pids == nil {
		t.Fatalf("left %+v", r)
	}

	// A parent not made yet: its nearest existing ancestor (the root).
	c, err = Detect(Options{MountInfo: mi, Root: root, Parent: "/berth/pods"})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Has("hugetlb") || c.Source != filepath.Join(root, "cgroup.controllers") {
		t.Fatalf("%+v", c)
	}
	if m := c.MissingOptional(); len(m) != 0 {
		t.Fatalf("missing optional: %v", m)
	}
}

func TestDropOnV1(t *testing.T) {
	c := &Controllers{Available: []string{"cpu", "cpuacct", "cpuset", "devices", "memory", "pids"}}
	classID := uint32(7)
	r := &specs.LinuxResources{
		HugepageLimits: []specs.LinuxHugepageLimit{{Pagesize: "2MB", Limit: 4 << 20}},
		Pids:           &specs.LinuxPids{Limit: new(int64)},
		BlockIO:        &specs.LinuxBlockIO{},
		Rdma:           map[string]specs.LinuxRdma{"mlx": {}},
		Network:        &specs.LinuxNetwork{ClassID: &classID},
	}
	dropped := c.Drop(r)
	if !reflect.DeepEqual(dropped, []string{"hugetlb", "rdma", "blkio", "net_cls"}) {
		t.Fatalf("dropped = %v", dropped)
	}
	if r.HugepageLimits != nil || r.BlockIO != nil || r.Rdma != nil || r.Network != nil || r.Pids == nil {
		t.Fatalf("left %+v", r)
	}
	if d := c.Drop(r); d != nil {
		t.Fatalf("second drop: %v", d)
	}
	var nilc *Controllers
	if d := nilc.Drop(&specs.LinuxResources{HugepageLimits: []specs.LinuxHugepageLimit{{}}}); d != nil {
		t.Fatal("nil Controllers dropped something")
	}
}

func TestHierarchies(t *testing.T) {
	hs, err := Hierarchies("testdata/mountinfo-v1-hugetlb", "")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, h := range hs {
		paths = append(paths, h.Path)
	}
	want := []string{
		"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/memory",
		"/sys/fs/cgroup/devices", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup/blkio", "/sys/fs/cgroup/pids",
		"/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/hugetlb", "/sys/fs/cgroup/net_cls,net_prio",
	}
	if !reflect.DeepEqual(paths, want) {
		t.Fatalf("hierarchies = %v\nwant %v", paths, want)
	}
	if got := hs[len(hs)-1].Controllers; !reflect.DeepEqual(got, []string{"net_cls", "net_prio"}) {
		t.Fatalf("controllers of the last = %v", got)
	}
	hs, err = Hierarchies("testdata/mountinfo-v2", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 1 || hs[0].Path != "/sys/fs/cgroup" {
		t.Fatalf("v2 hierarchies = %+v", hs)
	}
}

// TestDetectOnThisHost only checks that the host's own tables parse and
// name the controllers berth needs.
func TestDetectOnThisHost(t *testing.T) {
	c, err := Detect(Options{Parent: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if m := c.MissingRequired(); len(m) != 0 {
		t.Fatalf("this host lacks %v: %+v", m, c)
	}
	t.Logf("%s: available %v, missing optional %v", c.Version(), c.Available, c.MissingOptional())
}

// EnableDown writes, at each level from the root to the group, the
// root's controllers that level offers and has not enabled yet (a
// fixture tree of plain files stands in for cgroupfs).
func TestEnableDown(t *testing.T) {
	root := t.TempDir()
	for f, data := range map[string]string{
		"cgroup.controllers":         "cpu io memory\n",
		"cgroup.subtree_control":     "cpu\n",
		"a/cgroup.controllers":       "cpu io memory\n",
		"a/cgroup.subtree_control":   "",
		"a/b/cgroup.controllers":     "cpu memory\n",
		"a/b/cgroup.subtree_control": "cpu memory\n",
	} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := EnableDown(root, "/a/b"); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{
		"cgroup.subtree_control":     "+io +memory",
		"a/cgroup.subtree_control":   "+cpu +io +memory",
		"a/b/cgroup.subtree_control": "cpu memory\n", // nothing to add: untouched
	} {
		if b, _ := os.ReadFile(filepath.Join(root, f)); string(b) != want {
			t.Errorf("%s = %q, want %q", f, b, want)
		}
	}
	if err := EnableDown(root, "/a/c"); err == nil {
		t.Error("a level without cgroup.controllers is not an error")
	}
}
