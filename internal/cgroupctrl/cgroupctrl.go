// Package cgroupctrl finds which cgroup controllers the OCI runtime can use
// on this host, from what is mounted rather than from directory names, and
// drops from container specs the limits of optional controllers the host
// lacks, which runc would otherwise refuse ("cannot set hugetlb limit:
// container could not join or create cgroup").
//
// cgroup v1 (and hybrid): a controller is usable when a hierarchy of type
// "cgroup" carrying it in its super options is mounted below the cgroup
// root (/proc/self/mountinfo); runc's v1 manager looks hierarchies up the
// same way, so a /sys/fs/cgroup/hugetlb directory with nothing mounted on
// it does not count, nor does a hierarchy mounted elsewhere, nor a v1
// controller the hybrid unified tree offers (runc never uses it there). cgroup v2: a controller
// is usable when it is listed in cgroup.controllers of the cgroup pods are
// created under (or of its nearest existing ancestor).
package cgroupctrl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/systemd"
)

// DefaultRoot is where cgroup hierarchies are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// v1Controllers are the controller names a v1 hierarchy's super options
// may carry (others, like name=systemd, are named hierarchies).
var v1Controllers = []string{
	"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb",
	"memory", "misc", "net_cls", "net_prio", "perf_event", "pids", "rdma",
}

// Required are the controllers without which containers cannot run under
// the kubelet (runc fails every container: the kubelet always sets CPU
// and memory, runc always sets devices on v1).
var (
	RequiredV1 = []string{"cpu", "cpuacct", "cpuset", "devices", "memory"}
	RequiredV2 = []string{"cpu", "memory"}
)

// optional are the controllers whose limits the kubelet, an NRI plugin or
// UpdateContainerResources may ask for and a host may lack; when one is
// missing its limits are dropped (as containerd's
// tolerate_missing_hugetlb_controller does for hugetlb).
var optional = []optionalController{
	{name: "hugetlb", v1: true, v2: true, what: "hugepage limits", drop: func(r *specs.LinuxResources) bool {
		had := len(r.HugepageLimits) > 0
		r.HugepageLimits = nil
		return had
	}},
	{name: "pids", v1: true, v2: true, what: "pids limit", drop: func(r *specs.LinuxResources) bool {
		had := r.Pids != nil
		r.Pids = nil
		return had
	}},
	{name: "rdma", v1: true, v2: true, what: "RDMA limits", drop: func(r *specs.LinuxResources) bool {
		had := len(r.Rdma) > 0
		r.Rdma = nil
		return had
	}},
	{name: "blkio", v1: true, what: "block I/O limits", drop: dropBlockIO},
	{name: "io", v2: true, what: "block I/O limits", drop: dropBlockIO},
	{name: "net_cls", v1: true, what: "network class ID", drop: func(r *specs.LinuxResources) bool {
		had := r.Network != nil && r.Network.ClassID != nil
		if had {
			r.Network.ClassID = nil
		}
		return had
	}},
	{name: "net_prio", v1: true, what: "network priorities", drop: func(r *specs.LinuxResources) bool {
		had := r.Network != nil && len(r.Network.Priorities) > 0
		if had {
			r.Network.Priorities = nil
		}
		return had
	}},
	// misc has no OCI field: on v2 its limits come as unified keys.
	{name: "misc", v2: true, what: "misc limits", drop: func(*specs.LinuxResources) bool { return false }},
}

// optionalController is one optional controller: the cgroup versions
// that have it (v1's blkio is v2's io) and how its limits are dropped.
type optionalController struct {
	name   string
	v1, v2 bool
	// what names the limits dropped, for the log line and berthctl.
	what string
	drop func(r *specs.LinuxResources) bool
}

func (o optionalController) missing(c *Controllers) bool {
	return (c.V2 && o.v2 || !c.V2 && o.v1) && !c.Has(o.name)
}

func dropBlockIO(r *specs.LinuxResources) bool {
	had := r.BlockIO != nil
	r.BlockIO = nil
	return had
}

// Controllers is what the host offers the OCI runtime.
type Controllers struct {
	// V2 is set when the unified hierarchy is mounted at the cgroup root.
	V2 bool
	// Hybrid: v1 with a unified hierarchy mounted beside (not used for
	// limits).
	Hybrid bool
	// Available lists the usable controllers, sorted.
	Available []string
	// Source says where Available was read: the mountinfo file (v1) or a
	// cgroup.controllers file (v2).
	Source string
}

// Options say where to look; zero values mean the host's.
type Options struct {
	// MountInfo is read for the cgroup mounts; "" → /proc/self/mountinfo.
	MountInfo string
	// Root is the cgroup root; "" → /sys/fs/cgroup.
	Root string
	// Parent is the cgroup pods go under, as a path below the v2 root
	// ("/berth", or the cgroupfs path of a systemd slice,
	// "/kubepods.slice"); v2 reads its cgroup.controllers, or its nearest
	// existing ancestor's before the first pod creates it.
	Parent string
}

// Detect finds the usable controllers.
func Detect(opts Options) (*Controllers, error) {
	if opts.MountInfo == "" {
		opts.MountInfo = "/proc/self/mountinfo"
	}
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	f, err := os.Open(opts.MountInfo)
	if err != nil {
		return nil, fmt.Errorf("read cgroup mounts: %w", err)
	}
	defer f.Close()
	c, err := fromMounts(f, opts.Root)
	if err != nil {
		return nil, fmt.Errorf("read cgroup mounts from %s: %w", opts.MountInfo, err)
	}
	if !c.V2 {
		c.Source = opts.MountInfo
		return c, nil
	}
	dir := filepath.Join(opts.Root, filepath.Clean("/"+opts.Parent))
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		if err == nil {
			c.Available = strings.Fields(string(b))
			slices.Sort(c.Available)
			c.Source = filepath.Join(dir, "cgroup.controllers")
			return c, nil
		}
		if !errors.Is(err, os.ErrNotExist) || dir == opts.Root || dir == "/" {
			return nil, fmt.Errorf("read cgroup v2 controllers: %w", err)
		}
		dir = filepath.Dir(dir)
	}
}

// fromMounts reads a mountinfo table: v2 when a cgroup2 file system is
// mounted at root, else the v1 controllers of every "cgroup" mount.
func fromMounts(r io.Reader, root string) (*Controllers, error) {
	mounts, err := mountinfo.GetMountsFromReader(r, mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, err
	}
	c := &Controllers{}
	for _, m := range mounts {
		if m.FSType == "cgroup2" {
			if m.Mountpoint == root {
				c.V2 = true
			} else {
				c.Hybrid = true
			}
			continue
		}
		// runc's v1 manager looks for a controller's hierarchy only among
		// the mounts below the cgroup root (/sys/fs/cgroup/<name>).
		if !strings.HasPrefix(m.Mountpoint, root+"/") {
			continue
		}
		for _, opt := range strings.Split(m.VFSOptions, ",") {
			if slices.Contains(v1Controllers, opt) && !slices.Contains(c.Available, opt) {
				c.Available = append(c.Available, opt)
			}
		}
	}
	if c.V2 {
		c.Hybrid, c.Available = false, nil
		return c, nil
	}
	slices.Sort(c.Available)
	return c, nil
}

// Has reports whether controller name is usable.
func (c *Controllers) Has(name string) bool { return slices.Contains(c.Available, name) }

// Version is "v1", "v1 (hybrid)" or "v2".
func (c *Controllers) Version() string {
	switch {
	case c.V2:
		return "v2"
	case c.Hybrid:
		return "v1 (hybrid)"
	}
	return "v1"
}

// MissingRequired lists required controllers the host lacks.
func (c *Controllers) MissingRequired() []string {
	req := RequiredV1
	if c.V2 {
		req = RequiredV2
	}
	var out []string
	for _, n := range req {
		if !c.Has(n) {
			out = append(out, n)
		}
	}
	return out
}

// Missing is an optional controller the host lacks and the limits that
// are dropped because of it.
type Missing struct {
	Controller string `json:"controller"`
	Dropped    string `json:"dropped"`
}

// MissingOptional lists the optional controllers of this cgroup version
// the host lacks, with the limits Drop removes for each.
func (c *Controllers) MissingOptional() []Missing {
	var out []Missing
	for _, o := range optional {
		if o.missing(c) {
			out = append(out, Missing{Controller: o.name, Dropped: o.what})
		}
	}
	return out
}

// Drop removes from r the limits of missing optional controllers (on v2
// also unified keys of theirs, "hugetlb.2MB.max") and says which
// controllers' limits it removed. A nil Controllers or r drops nothing.
func (c *Controllers) Drop(r *specs.LinuxResources) []string {
	if c == nil || r == nil {
		return nil
	}
	var dropped []string
	for _, o := range optional {
		if !o.missing(c) {
			continue
		}
		had := o.drop(r)
		for k := range r.Unified {
			if prefix, _, _ := strings.Cut(k, "."); prefix == o.name {
				delete(r.Unified, k)
				had = true
			}
		}
		if had {
			dropped = append(dropped, o.name)
		}
	}
	if r.Network != nil && r.Network.ClassID == nil && len(r.Network.Priorities) == 0 {
		r.Network = nil
	}
	return dropped
}

// Hierarchy is one mounted cgroup hierarchy.
type Hierarchy struct {
	// Path is where it is mounted.
	Path string
	// Controllers it carries (v1); nil for the unified one.
	Controllers []string
}

// Hierarchies lists the mounted hierarchies pod cgroups are made in: the
// unified root on v2; every v1 hierarchy (named ones included) and the
// hybrid unified one otherwise, each once (the first mount of its root).
// mountInfo "" → /proc/self/mountinfo; root "" → /sys/fs/cgroup.
func Hierarchies(mountInfo, root string) ([]Hierarchy, error) {
	if mountInfo == "" {
		mountInfo = "/proc/self/mountinfo"
	}
	if root == "" {
		root = DefaultRoot
	}
	f, err := os.Open(mountInfo)
	if err != nil {
		return nil, fmt.Errorf("read cgroup mounts: %w", err)
	}
	defer f.Close()
	mounts, err := mountinfo.GetMountsFromReader(f, mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup mounts from %s: %w", mountInfo, err)
	}
	for _, m := range mounts {
		if m.FSType == "cgroup2" && m.Mountpoint == root {
			return []Hierarchy{{Path: root}}, nil
		}
	}
	seen := map[[2]int]bool{}
	var out []Hierarchy
	for _, m := range mounts {
		dev := [2]int{m.Major, m.Minor}
		// A bind mount of part of a hierarchy names its cgroups by other
		// paths: only whole hierarchies count, and only below the root,
		// where runc looks.
		if m.Root != "/" || seen[dev] || !strings.HasPrefix(m.Mountpoint, root+"/") {
			continue
		}
		seen[dev] = true
		h := Hierarchy{Path: m.Mountpoint}
		if m.FSType == "cgroup" {
			for _, opt := range strings.Split(m.VFSOptions, ",") {
				if slices.Contains(v1Controllers, opt) {
					h.Controllers = append(h.Controllers, opt)
				}
			}
		}
		out = append(out, h)
	}
	return out, nil
}

// PodParent is the cgroup path (below a hierarchy root) pods go under
// when the kubelet names no parent: parent as a cgroupfs path, or the path
// of its slice under the systemd driver (or when spelled as a slice).
func PodParent(driver, parent string) (string, error) {
	if driver == "systemd" || (strings.HasSuffix(parent, ".slice") && !strings.Contains(parent, "/")) {
		slice, err := systemd.ParentSlice(parent)
		if err != nil {
			return "", err
		}
		return systemd.ExpandSlice(slice)
	}
	return path.Clean("/" + parent), nil
}

// EnableControllers writes "+ctl" to dir's cgroup.subtree_control for each
// of want that dir offers (cgroup.controllers) and has not enabled yet.
// All at once first, then one by one, as runc does.
func EnableControllers(dir string, want []string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers of %s: %w", dir, err)
	}
	on, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("read enabled controllers of %s: %w", dir, err)
	}
	var add []string
	for _, c := range want {
		if slices.Contains(strings.Fields(string(avail)), c) && !slices.Contains(strings.Fields(string(on)), c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	f := filepath.Join(dir, "cgroup.subtree_control")
	if os.WriteFile(f, []byte(strings.Join(add, " ")), 0o644) == nil {
		return nil
	}
	var errs []error
	for _, c := range add {
		if err := os.WriteFile(f, []byte(c), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("write %s to %s: %w", c, f, err))
		}
	}
	return errors.Join(errs...)
}

// EnableDown enables, on cgroup v2, every controller the root at root
// offers in cgroup.subtree_control of each cgroup from the root down to
// group (made if missing), as runc does for a container's ancestors and
// berthd for each pod. Called at start for the default pod parent, so that
// Detect sees what pods will get, not what a parent made before the
// controllers were enabled happens to show.
func EnableDown(root, group string) error {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers of %s: %w", root, err)
	}
	want := strings.Fields(string(b))
	group = path.Clean("/" + group)
	if err := os.MkdirAll(filepath.Join(root, group), 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", group, err)
	}
	var levels []string
	for d := group; ; d = path.Dir(d) {
		levels = append(levels, d)
		if d == "/" {
			break
		}
	}
	var errs []error
	for i := len(levels) - 1; i >= 0; i-- {
		if err := EnableControllers(filepath.Join(root, levels[i]), want); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
