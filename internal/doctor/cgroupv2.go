package doctor

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/systemd"
)

// checkCgroupV2 reports, on a cgroup v2 host, what berth's pod cgroups
// will find: the unified hierarchy, the controllers the root offers and
// enables, those of the pod parent, whether systemd runs (and so which
// driver fits), and whether every cgroup between the root and the pod
// parent can delegate controllers (none of them may hold a process: cgroup
// v2's no-internal-process rule). Nothing on a v1 host.
func checkCgroupV2(cfg *config.Config) []Result {
	c, err := cgroupctrl.Detect(cgroupctrl.Options{})
	if err != nil || !c.V2 {
		return nil
	}
	return []Result{cgroupV2Result(cgroupctrl.DefaultRoot, cfg, systemd.BootedDir)}
}

// cgroupV2Result is checkCgroupV2 on the unified hierarchy mounted at root
// (tests point it at a fixture tree).
func cgroupV2Result(root string, cfg *config.Config, bootedDir string) Result {
	r := Result{Name: "cgroup v2", Level: OK}
	driver := cfg.EffectiveCgroupDriver()
	read := func(group, file string) ([]string, bool) {
		b, err := os.ReadFile(filepath.Join(root, group, file))
		return strings.Fields(string(b)), err == nil
	}
	rootCtl, ok := read("/", "cgroup.controllers")
	if !ok {
		r.Level, r.Message = Fail, "unified hierarchy at "+root+" without cgroup.controllers"
		r.Hint = "mount cgroup2 at " + root
		return r
	}
	rootOn, _ := read("/", "cgroup.subtree_control")
	_, err := os.Stat(bootedDir)
	booted := err == nil
	parts := []string{
		"unified hierarchy at " + root,
		"root offers: " + strings.Join(rootCtl, " "),
		"root enables: " + orNone(rootOn),
		"systemd running: " + yesNo(booted) + " (driver " + driver + ")",
	}
	parent, err := cgroupctrl.PodParent(driver, cfg.CgroupParent)
	if err != nil {
		r.Level, r.Message, r.Hint = Fail, err.Error(), "fix cgroup_parent"
		return r
	}
	if ctl, ok := read(parent, "cgroup.controllers"); ok {
		parts = append(parts, "pod parent "+parent+" offers: "+orNone(ctl))
		var missing []string
		for _, want := range cgroupctrl.RequiredV2 {
			if !slices.Contains(ctl, want) && slices.Contains(rootCtl, want) {
				missing = append(missing, want)
			}
		}
		if len(missing) > 0 && driver == "systemd" {
			r.Level = Warn
			r.Hint = "systemd enables controllers for a slice only when a unit below asks (berth's pod slices do): " + strings.Join(missing, " ") + " appear with the first pod"
		}
	} else {
		parts = append(parts, "pod parent "+parent+" not yet created")
	}
	// Delegation: berth (cgroupfs) and runc enable controllers in
	// cgroup.subtree_control from the root down; a non-root cgroup on the
	// way that holds a process refuses domain controllers (EBUSY).
	var busy []string
	for d := path.Dir(path.Clean("/" + parent)); d != "/"; d = path.Dir(d) {
		if procs, ok := read(d, "cgroup.procs"); ok && len(procs) > 0 {
			busy = append(busy, fmt.Sprintf("%s (%d processes)", d, len(procs)))
		}
	}
	if procs, ok := read(parent, "cgroup.procs"); ok && len(procs) > 0 && parent != "/" {
		busy = append(busy, fmt.Sprintf("%s (%d processes)", parent, len(procs)))
	}
	if len(busy) > 0 {
		r.Level = Fail
		parts = append(parts, "cgroups holding processes on the way to the pods: "+strings.Join(busy, ", "))
		r.Hint = "cgroup v2 lets no cgroup with processes enable controllers for children: move those processes into a leaf cgroup (or choose another cgroup_parent)"
	} else {
		parts = append(parts, "delegation: no process between the root and the pods")
	}
	r.Message = strings.Join(parts, "; ")
	return r
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "(none)"
	}
	return strings.Join(list, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
