// Package cgroupplan says, without touching a kernel, which cgroups a pod
// has: who makes each one, which processes sit in it and, on cgroup v2,
// which controllers each enables for its children (cgroup.subtree_control).
// The sandbox code executes the part berth owns; tests check plans
// against cgroup v2's rules for every cgroup version, driver and pod shape.
//
// The layout, the same on v1 and v2:
//
//	<parent>/pod-<id>                 pod cgroup: pod limits and stats, no process of its own
//	<parent>/pod-<id>/berth-pause     the pod's holder process (shared PID or user namespace)
//	<parent>/pod-<id>/<container-id>  each container (made by the OCI runtime)
//
// Under the systemd driver the pod cgroup is the slice systemd made, the
// holder runs in the scope berth-pause-<id>.scope and each container in
// runc's scope berth-<container-id>.scope.
//
// cgroup v2 forbids a non-root cgroup that holds processes to hand domain
// controllers (memory, io, ...) to children ("no internal processes"):
// a holder sitting in the pod cgroup itself would make runc's container
// cgroups "domain invalid" and every CreateContainer fail (decision 2200).
// The holder therefore
// has a leaf of its own, as containerd's pause container and CRI-O's
// infra container do.
package cgroupplan

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// HolderName is the holder's cgroup below the pod cgroup (cgroupfs
// driver). Container IDs are 64 hex digits, so it never names a
// container's cgroup.
const HolderName = "berth-pause"

// HolderScope is the holder's scope in the pod slice (systemd driver).
func HolderScope(podID string) string { return "berth-pause-" + podID + ".scope" }

// ContainerScope is the scope runc starts for a container in the pod
// slice (cgroupsPath "<slice>:berth:<id>").
func ContainerScope(id string) string { return "berth-" + id + ".scope" }

// Who makes (and removes) a cgroup.
type Maker string

// Makers.
const (
	// Host: exists before berth (the root, the kubelet's parents), or
	// made by berth with mkdir -p and left when the pod goes.
	Host    Maker = "host"
	Berth   Maker = "berth"
	Systemd Maker = "systemd"
	// Runtime: the OCI runtime (runc, crun).
	Runtime Maker = "runtime"
)

// Input describes one pod.
type Input struct {
	// V2 is set on a unified (cgroup v2) host.
	V2 bool
	// Systemd is set under the systemd cgroup driver.
	Systemd bool
	// PodID is the sandbox ID.
	PodID string
	// Pod is the pod cgroup's path below the hierarchy roots: cgroupfs
	// <parent>/pod-<id>; systemd the cgroup of the pod slice.
	Pod string
	// Holder is set when the pod runs berth-pause (a PID namespace shared
	// by the pod, or a user namespace).
	Holder bool
	// Containers are the IDs of the pod's containers.
	Containers []string
	// Controllers are the v2 controllers to enable on the way down to the
	// containers (cgroup.controllers of the root, as runc does).
	Controllers []string
}

// Cgroup is one cgroup of a plan.
type Cgroup struct {
	// Path below the hierarchy roots.
	Path string
	// MadeBy makes it, and removes it with the pod unless Host.
	MadeBy Maker
	// Procs names the processes that sit in it ("berth-pause",
	// "container <id>").
	Procs []string
	// Enable lists the v2 controllers berth writes to its
	// cgroup.subtree_control (nil where berth writes nothing).
	Enable []string
}

// Plan is a pod's cgroups, every parent before its children.
type Plan struct {
	V2      bool
	Cgroups []Cgroup
}

// Pod plans pod in's cgroups.
func Pod(in Input) Plan {
	p := Plan{V2: in.V2}
	pod := path.Clean("/" + in.Pod)
	var enable []string
	if in.V2 && !in.Systemd {
		// berth enables, as runc does, every controller from the root
		// down to the pod cgroup, so the pod cgroup has its limit and
		// stat files before any container exists.
		enable = slices.Clone(in.Controllers)
	}
	if !in.Systemd {
		// Ancestors, root first.
		var anc []string
		for d := path.Dir(pod); ; d = path.Dir(d) {
			anc = append(anc, d)
			if d == "/" {
				break
			}
		}
		slices.Reverse(anc)
		for _, d := range anc {
			p.Cgroups = append(p.Cgroups, Cgroup{Path: d, MadeBy: Host, Enable: enable})
		}
		p.Cgroups = append(p.Cgroups, Cgroup{Path: pod, MadeBy: Berth, Enable: enable})
	} else {
		p.Cgroups = append(p.Cgroups, Cgroup{Path: pod, MadeBy: Systemd})
	}
	if in.Holder {
		h := Cgroup{Path: path.Join(pod, HolderName), MadeBy: Berth, Procs: []string{"berth-pause"}}
		if in.Systemd {
			h = Cgroup{Path: path.Join(pod, HolderScope(in.PodID)), MadeBy: Systemd, Procs: []string{"berth-pause"}}
		}
		p.Cgroups = append(p.Cgroups, h)
	}
	for _, id := range in.Containers {
		c := Cgroup{Path: path.Join(pod, id), MadeBy: Runtime, Procs: []string{"container " + id}}
		if in.Systemd {
			c.Path = path.Join(pod, ContainerScope(id))
		}
		p.Cgroups = append(p.Cgroups, c)
	}
	return p
}

// Holder is the cgroup the holder process joins; ok is false when the pod
// has none.
func (p Plan) Holder() (c Cgroup, ok bool) {
	for _, c := range p.Cgroups {
		if slices.Contains(c.Procs, "berth-pause") {
			return c, true
		}
	}
	return Cgroup{}, false
}

// Made lists the cgroups berth itself makes (and removes), parents first.
func (p Plan) Made() []Cgroup {
	var out []Cgroup
	for _, c := range p.Cgroups {
		if c.MadeBy == Berth {
			out = append(out, c)
		}
	}
	return out
}

// domain controllers cannot be enabled below a cgroup with processes;
// the threaded ones (cpu, cpuset, perf_event, pids) can, but enabling
// them there turns the cgroup into a threaded root whose domain children
// are invalid, which is what broke shared-PID pods.
var threaded = []string{"cpu", "cpuset", "perf_event", "pids"}

// Domain reports whether controller c is a domain controller.
func Domain(c string) bool { return !slices.Contains(threaded, c) }

// Check verifies p against cgroup v2's rules (on v1 there are none to
// break): no cgroup other than the root holds processes and has children
// or enables controllers for children; every controller enabled at a
// container's or the holder's parent is enabled down the whole way from
// the root.
func (p Plan) Check() error {
	if !p.V2 {
		return nil
	}
	var errs []error
	for _, c := range p.Cgroups {
		if len(c.Procs) == 0 || c.Path == "/" {
			continue
		}
		if len(c.Enable) > 0 {
			errs = append(errs, fmt.Errorf("%s holds %s and enables %s for children", c.Path, strings.Join(c.Procs, ", "), strings.Join(c.Enable, " ")))
		}
		for _, d := range p.Cgroups {
			if d.Path != c.Path && strings.HasPrefix(d.Path, c.Path+"/") {
				errs = append(errs, fmt.Errorf("%s holds %s and has the child %s", c.Path, strings.Join(c.Procs, ", "), d.Path))
			}
		}
	}
	byPath := map[string]Cgroup{}
	for _, c := range p.Cgroups {
		byPath[c.Path] = c
	}
	for _, c := range p.Cgroups {
		parent, ok := byPath[path.Dir(c.Path)]
		if c.Path == "/" || !ok || len(parent.Enable) == 0 {
			continue
		}
		for d := path.Dir(parent.Path); ; d = path.Dir(d) {
			if a, ok := byPath[d]; ok {
				for _, ctl := range parent.Enable {
					if !slices.Contains(a.Enable, ctl) {
						errs = append(errs, fmt.Errorf("%s enables %s but its ancestor %s does not", parent.Path, ctl, d))
					}
				}
			}
			if d == "/" {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// String draws the plan, one cgroup a line, for test failures and logs.
func (p Plan) String() string {
	var b strings.Builder
	for _, c := range p.Cgroups {
		fmt.Fprintf(&b, "%s (%s)", c.Path, c.MadeBy)
		if len(c.Procs) > 0 {
			fmt.Fprintf(&b, " procs=[%s]", strings.Join(c.Procs, ", "))
		}
		if len(c.Enable) > 0 {
			fmt.Fprintf(&b, " +%s", strings.Join(c.Enable, " +"))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// CPUWeightFromShares maps cgroup v1 cpu.shares [2, 262144] onto cgroup v2
// cpu.weight [1, 10000] linearly, the conversion the kubelet and the OCI
// runtimes use, so a pod gets the same weight whichever driver set it.
func CPUWeightFromShares(shares uint64) uint64 {
	if shares < 2 {
		shares = 2
	}
	if shares > 262144 {
		shares = 262144
	}
	return 1 + ((shares-2)*9999)/262142
}
