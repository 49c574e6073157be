// Package leakcheck snapshots what a test daemon can leave on the node
// (mounts, veths, IPAM reservations, iptables rules, cgroups, processes and
// files) so a test can assert that a run of operations left nothing new.
// Every probe is scoped to one daemon (its dirs, bridge, subnet, cgroup
// parent), so parallel tests do not disturb each other's snapshots.
package leakcheck

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/network/iptables"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// Scope says what belongs to the daemon under test.
type Scope struct {
	// Dir is the daemon's scratch dir: processes naming it are its own.
	Dir string
	// State is --state: every mount and file below it counts.
	State string
	// IPAMDir is host-local's dataDir; reservations are files in it.
	IPAMDir string
	// Bridge is the pod bridge; its ports (veths) count.
	Bridge string
	// IPPrefix (e.g. "10.234.7.") selects iptables rules about pod IPs.
	IPPrefix string
	// CgroupParent is the daemon's cgroup parent, relative to each hierarchy.
	CgroupParent string
	// Root, if set, is --root: mounts below it (overlay rootfs) and its
	// files and directories count too (unpacked layer contents and mounted
	// rootfs contents are not walked; their directories are listed).
	Root string
	// IgnoreFiles are paths (relative to State or IPAMDir) that are
	// expected to persist, such as host-local's lock file.
	IgnoreFiles []string
}

// Snapshot maps a category to the sorted items found in it.
type Snapshot map[string][]string

// ForDaemon builds the scope of a berthdtest daemon.
func ForDaemon(d *berthdtest.Daemon) Scope {
	subnet := d.Config.DefaultNetwork.Subnet
	prefix := subnet
	if i := strings.LastIndex(subnet, "."); i >= 0 {
		prefix = subnet[:i+1]
	}
	return Scope{
		Dir: d.Dir, State: d.State, IPAMDir: filepath.Join(d.Root, "cni", "networks"),
		Bridge: d.Config.DefaultNetwork.Bridge, IPPrefix: prefix, CgroupParent: d.Config.CgroupParent,
		IgnoreFiles: []string{"lock", "last_reserved_ip.0", "last_reserved_ip.1"},
	}
}

// Take records the current state of every category.
func Take(t testing.TB, s Scope) Snapshot {
	t.Helper()
	snap := Snapshot{}
	mounts, err := berthdtest.MountsBelow(s.State)
	if err != nil {
		t.Fatalf("leakcheck: mounts: %v", err)
	}
	snap["mount"] = mounts
	snap["file"] = files(s.State, s.IgnoreFiles)
	if s.Root != "" {
		rootMounts, err := berthdtest.MountsBelow(s.Root)
		if err != nil {
			t.Fatalf("leakcheck: mounts: %v", err)
		}
		snap["root-mount"] = rootMounts
		snap["root-entry"] = entries(s.Root, s.IgnoreFiles)
	}
	if s.IPAMDir != "" {
		snap["ipam"] = files(s.IPAMDir, s.IgnoreFiles)
	}
	if s.Bridge != "" {
		out, _ := exec.Command("ip", "-o", "link", "show", "master", s.Bridge).Output()
		snap["veth"] = linkNames(string(out))
	}
	if s.IPPrefix != "" {
		snap["iptables"], snap["iptables-chain"] = rulesAbout(t, s.IPPrefix)
	}
	if s.CgroupParent != "" {
		snap["cgroup"] = cgroups(s.CgroupParent)
	}
	if s.Dir != "" {
		var procs []string
		for _, pid := range berthdtest.PidsMentioning(s.Dir) {
			cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			// The daemon itself is expected; anything else it started is not.
			if strings.Contains(string(cmd), "berthd") {
				continue
			}
			procs = append(procs, strconv.Itoa(pid)+" "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
		snap["process"] = procs
	}
	for k := range snap {
		sort.Strings(snap[k])
	}
	return snap
}

// Diff lists items in after that are not in before, as "category: item".
func Diff(before, after Snapshot) []string {
	var out []string
	for cat, items := range after {
		old := map[string]bool{}
		for _, i := range before[cat] {
			old[i] = true
		}
		for _, i := range items {
			if !old[i] {
				out = append(out, cat+": "+i)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Check fails the test if after holds anything before did not.
func Check(t testing.TB, before, after Snapshot) {
	t.Helper()
	if leaks := Diff(before, after); len(leaks) > 0 {
		t.Fatalf("leaked %d items:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
}

// CheckSettled is Check for tests running beside other daemons: node-wide
// probes (unreferenced CNI chains) can catch another daemon mid-ADD, so a
// finding must still be there in a second snapshot a moment later.
func CheckSettled(t testing.TB, s Scope, before, after Snapshot) {
	t.Helper()
	leaks := Diff(before, after)
	if len(leaks) == 0 {
		return
	}
	time.Sleep(time.Second)
	again := map[string]bool{}
	for _, l := range Diff(before, Take(t, s)) {
		again[l] = true
	}
	var confirmed []string
	for _, l := range leaks {
		if again[l] {
			confirmed = append(confirmed, l)
		}
	}
	if len(confirmed) > 0 {
		t.Fatalf("leaked %d items:\n%s", len(confirmed), strings.Join(withSmallFiles(confirmed), "\n"))
	}
}

// withSmallFiles adds the text of each leaked file of at most 8 KiB (a
// log, a record) to its line: what wrote it is usually named there, and
// the file may be gone by the time anyone looks.
func withSmallFiles(leaks []string) []string {
	out := make([]string, 0, len(leaks))
	for _, l := range leaks {
		if p, ok := strings.CutPrefix(l, "file: "); ok {
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Size() <= 8<<10 {
				if data, err := os.ReadFile(p); err == nil {
					l += "\n    " + strings.ReplaceAll(strings.TrimRight(string(data), "\n"), "\n", "\n    ")
				}
			}
		}
		out = append(out, l)
	}
	return out
}

// rulesAbout lists the rules of every table of both families that name
// ipPrefix, and the CNI chains that no rule jumps to
// (unreferencedCNIChains); IPv6 ones are marked "ip6tables".
func rulesAbout(t testing.TB, ipPrefix string) (rules, chains []string) {
	for _, f := range iptables.Families() {
		if !f.Available() {
			continue
		}
		tables, err := iptables.Save(context.Background(), f, "")
		if err != nil {
			t.Fatalf("leakcheck: %v", err)
		}
		mark := ""
		if f == iptables.IPv6 {
			mark = "ip6tables "
		}
		for _, tb := range tables {
			for _, r := range tb.Rules {
				if strings.Contains(r.Line, ipPrefix) {
					rules = append(rules, mark+r.Line)
				}
			}
		}
		for _, c := range unreferencedCNIChains(tables, ipPrefix) {
			chains = append(chains, mark+c)
		}
	}
	return rules, chains
}

// unreferencedCNIChains lists CNI-* chains (per table) that no rule jumps
// to: what is left when a plugin's DEL removed the jump but not the chain.
// Chains are named by a hash, so their rules (the bridge plugin's
// masquerade rules name the pod subnet) are what ties them to one daemon:
// a chain whose rules only name other addresses belongs to another test
// daemon (one killed mid-ADD by a fault test, say) and is not counted. An
// empty chain cannot be attributed and counts. portmap's shared
// CNI-HOSTPORT-* chains are always referenced.
func unreferencedCNIChains(tables []iptables.Table, ipPrefix string) []string {
	var out []string
	for _, tb := range tables {
		referenced := map[string]bool{}
		ours := map[string]bool{}
		hasRules := map[string]bool{}
		for _, r := range tb.Rules {
			hasRules[r.Chain] = true
			if ipPrefix == "" || strings.Contains(r.Line, ipPrefix) {
				ours[r.Chain] = true
			}
			referenced[r.Target] = true
		}
		for _, c := range tb.Chains {
			if !strings.HasPrefix(c, "CNI-") || strings.HasPrefix(c, "CNI-HOSTPORT-") {
				continue
			}
			if !referenced[c] && (ours[c] || !hasRules[c]) {
				out = append(out, tb.Name+"/"+c)
			}
		}
	}
	return out
}

func files(root string, ignore []string) []string {
	var out []string
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		for _, ig := range ignore {
			if e.Name() == ig {
				return nil
			}
		}
		out = append(out, p)
		return nil
	})
	return out
}

// entries lists files and directories below root, without descending into
// overlay rootfs mounts or unpacked layer contents ("rootfs", "diff").
func entries(root string, ignore []string) []string {
	var out []string
	_ = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		for _, ig := range ignore {
			if e.Name() == ig {
				return nil
			}
		}
		out = append(out, p)
		if e.IsDir() && (e.Name() == "rootfs" || e.Name() == "diff") {
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

func linkNames(out string) []string {
	var names []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if i := strings.Index(name, "@"); i >= 0 {
			name = name[:i]
		}
		names = append(names, name)
	}
	return names
}

func cgroups(parent string) []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		top := filepath.Join(r, parent)
		if fi, err := os.Stat(top); err != nil || !fi.IsDir() {
			continue
		}
		_ = filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() && p != top {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}
