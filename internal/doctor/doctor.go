// Package doctor checks a node the way an operator would before pointing
// the kubelet at berth: runtime, CNI, overlayfs, cgroups, iptables, kernel
// features and permissions. Each check says ok, warn or fail, with a hint.
package doctor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/hostprobe"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/systemd"
)

// Level is a check's verdict.
type Level string

// Verdicts, from good to bad.
const (
	OK   Level = "ok"
	Warn Level = "warn"
	Fail Level = "fail"
)

// Result is one check's outcome.
type Result struct {
	Name    string
	Level   Level
	Message string
	Hint    string // how to fix, when not ok
}

// Run performs every check against cfg.
func Run(ctx context.Context, cfg *config.Config) []Result {
	var out []Result
	out = append(out, checkRuntimes(ctx, cfg)...)
	out = append(out, checkCNI(cfg)...)
	out = append(out,
		checkOverlay(),
		checkCgroups(cfg),
		checkCgroupDriver(cfg.EffectiveCgroupDriver(), systemd.BootedDir),
	)
	out = append(out, checkCgroupV2(cfg)...)
	out = append(out,
		checkIptables(ctx),
		checkCRIU(ctx, cfg),
		checkNamespaces(),
		checkSeccomp(),
		checkPrivileges(),
		checkDir("root", cfg.Root),
		checkDir("state", cfg.State),
		checkDir("socket directory", filepath.Dir(cfg.SocketPath())),
		checkStateTree(cfg),
		checkStreaming(cfg),
		checkMirrorPolicy(cfg),
	)
	return out
}

// Failed reports whether any result is a failure.
func Failed(results []Result) bool {
	for _, r := range results {
		if r.Level == Fail {
			return true
		}
	}
	return false
}

// Print writes one line per result, with hints indented below.
func Print(w io.Writer, results []Result) {
	for _, r := range results {
		fmt.Fprintf(w, "%-4s  %-22s %s\n", r.Level, r.Name, r.Message)
		if r.Hint != "" && r.Level != OK {
			fmt.Fprintf(w, "      %-22s fix: %s\n", "", r.Hint)
		}
	}
}

func checkRuntimes(ctx context.Context, cfg *config.Config) []Result {
	names := make([]string, 0, len(cfg.RuntimeHandlers))
	for n := range cfg.RuntimeHandlers {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Result
	for _, name := range names {
		h := cfg.RuntimeHandlers[name]
		r := Result{Name: "runtime " + name}
		path, err := exec.LookPath(h.Binary)
		if err != nil {
			r.Level, r.Message = Fail, fmt.Sprintf("OCI runtime %q not found", h.Binary)
			r.Hint = "install it (apt-get install runc) or set runtime / runtime_handlers." + name + ".binary to its path"
			out = append(out, r)
			continue
		}
		v, err := oci.Version(ctx, path)
		if err != nil {
			r.Level, r.Message = Fail, fmt.Sprintf("%s --version failed: %v", path, err)
			r.Hint = "reinstall the runtime; it must run on this kernel"
			out = append(out, r)
			continue
		}
		r.Level, r.Message = OK, fmt.Sprintf("%s (%s)", path, firstLine(v))
		out = append(out, r)
		if vr := runtimeVersionResult(name, v); vr != nil {
			out = append(out, *vr)
		}
	}
	return out
}

// runtimeVersionResult warns when the handler's runtime predates the
// upstream fixes of its own CVEs (hostprobe.runtimeAdvisories). A
// warning, not a failure: distributions backport fixes without changing
// the version, and berthd runs either way. nil when there is nothing to
// say beyond the runtime line.
func runtimeVersionResult(handler, versionOut string) *Result {
	v, err := hostprobe.ParseRuntimeVersion(versionOut)
	if err != nil {
		return nil // the runtime line shows what it printed
	}
	w := v.Warning()
	if w == "" {
		return nil
	}
	return &Result{Name: "runtime " + handler + " version", Level: Warn, Message: w,
		Hint: "upgrade " + v.Name + " to a release with the fixes, or check that your distribution's package carries them (docs/security.md)"}
}

// requiredPlugins are what berth's embedded default network uses.
var requiredPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

func checkCNI(cfg *config.Config) []Result {
	plugins := Result{Name: "cni plugins", Level: OK}
	var missing []string
	for _, p := range requiredPlugins {
		if findPlugin(cfg.CNIBinDirs, p) == "" {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		plugins.Level = Fail
		plugins.Message = fmt.Sprintf("missing %s in %s", strings.Join(missing, ", "), strings.Join(cfg.CNIBinDirs, ":"))
		plugins.Hint = "apt-get install containernetworking-plugins, or point cni_bin_dirs at your plugins"
	} else {
		plugins.Message = "bridge, host-local, loopback, portmap found"
	}
	conf := Result{Name: "cni config", Level: OK}
	matches, _ := filepath.Glob(filepath.Join(cfg.CNIConfDir, "*.conf*"))
	var found []string
	for _, m := range matches {
		if ext := filepath.Ext(m); ext == ".conf" || ext == ".conflist" || ext == ".json" {
			found = append(found, filepath.Base(m))
		}
	}
	if len(found) == 0 {
		conf.Message = fmt.Sprintf("no config in %s: the embedded default bridge network will be used", cfg.CNIConfDir)
	} else {
		sort.Strings(found)
		conf.Message = fmt.Sprintf("using %s from %s", found[0], cfg.CNIConfDir)
	}
	return []Result{plugins, conf}
}

func findPlugin(dirs []string, name string) string {
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

func checkOverlay() Result {
	release := ""
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		release = strings.TrimSpace(string(data))
	}
	return overlayVerdict("/proc/filesystems", "/sys/module/overlay", filepath.Join("/lib/modules", release))
}

// overlayVerdict passes a kernel that lists overlay, has its module loaded,
// or can load it: a freshly booted node loads the module only at the first
// overlay mount, which berthd's first unpack does (the kernel autoloads
// "fs-overlay"), so a module the kernel ships is as good as a loaded one.
func overlayVerdict(filesystems, loadedModule, modulesDir string) Result {
	r := Result{Name: "overlayfs"}
	data, err := os.ReadFile(filesystems)
	if err == nil && strings.Contains(string(data), "\toverlay\n") {
		r.Level, r.Message = OK, "supported by the kernel"
		return r
	}
	if _, err := os.Stat(loadedModule); err == nil {
		r.Level, r.Message = OK, "module loaded"
		return r
	}
	if modulesListOverlay(modulesDir) {
		r.Level, r.Message = OK, "module available, loaded at the first overlay mount"
		return r
	}
	r.Level, r.Message = Fail, "the kernel does not list overlay in /proc/filesystems and ships no overlay module"
	r.Hint = "modprobe overlay (and add it to /etc/modules-load.d), or install the kernel's modules package"
	return r
}

// modulesListOverlay reports whether modules.dep (loadable) or
// modules.builtin under dir names the overlay module (overlay.ko, possibly
// compressed: overlay.ko.xz, .zst, .gz).
func modulesListOverlay(dir string) bool {
	for _, name := range []string{"modules.dep", "modules.builtin"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			path, _, _ := strings.Cut(sc.Text(), ":")
			base := filepath.Base(path)
			if base == "overlay.ko" || strings.HasPrefix(base, "overlay.ko.") {
				f.Close()
				return true
			}
		}
		f.Close()
	}
	return false
}

// checkCgroupDriver fails the systemd driver on a node where systemd is
// not the running init (berthd refuses to start there) and warns about the
// cgroupfs driver on a systemd node, where kubeadm's kubelet defaults to
// cgroupDriver: systemd.
func checkCgroupDriver(driver, bootedDir string) Result {
	r := Result{Name: "cgroup driver"}
	_, err := os.Stat(bootedDir)
	booted := err == nil
	switch {
	case driver == "systemd" && booted:
		r.Level, r.Message = OK, "systemd (systemd is running)"
	case driver == "systemd":
		r.Level, r.Message = Fail, "cgroup_driver is systemd but systemd is not running (no "+bootedDir+"): berthd will not start"
		r.Hint = `set cgroup_driver = "cgroupfs" (and cgroupDriver: cgroupfs in the kubelet)`
	case booted:
		r.Level, r.Message = Warn, "cgroupfs, but systemd runs this node: a kubelet set up by kubeadm uses cgroupDriver: systemd"
		r.Hint = `set cgroup_driver = "systemd" to match the kubelet, or cgroupDriver: cgroupfs in the kubelet`
	default:
		r.Level, r.Message = OK, "cgroupfs (systemd is not running)"
	}
	return r
}

// checkCgroups reports the controllers the runtime can use, detected
// from the cgroup mounts (a v1 controller directory with no hierarchy
// mounted does not count), and the limits berthd drops for missing
// optional ones.
func checkCgroups(cfg *config.Config) Result {
	return cgroupResult(cgroupctrl.Options{}, cfg)
}

func cgroupResult(opts cgroupctrl.Options, cfg *config.Config) Result {
	r := Result{Name: "cgroups"}
	driver := cfg.EffectiveCgroupDriver()
	parent, err := cgroupctrl.PodParent(driver, cfg.CgroupParent)
	if err != nil {
		r.Level, r.Message = Fail, err.Error()
		r.Hint = "fix cgroup_parent"
		return r
	}
	opts.Parent = parent
	c, err := cgroupctrl.Detect(opts)
	if err != nil {
		r.Level, r.Message = Fail, err.Error()
		r.Hint = "mount the cgroup controllers (or boot with cgroup v2)"
		return r
	}
	r.Level, r.Message = OK, c.Version()+", controllers: "+strings.Join(c.Available, " ")
	if missing := c.MissingRequired(); len(missing) > 0 {
		r.Level = Fail
		r.Message = fmt.Sprintf("%s without the %s controllers (have: %s)", c.Version(), strings.Join(missing, " "), strings.Join(c.Available, " "))
		r.Hint = "mount the cgroup controllers (or boot with cgroup v2)"
		if c.V2 {
			r.Hint = "enable them in cgroup.subtree_control down to " + c.Source
		}
		return r
	}
	var missing []string
	hugetlb := false
	for _, m := range c.MissingOptional() {
		missing = append(missing, m.Controller+" ("+m.Dropped+")")
		hugetlb = hugetlb || m.Controller == "hugetlb"
	}
	if len(missing) > 0 {
		r.Message += "; missing, so berthd drops their limits: " + strings.Join(missing, ", ")
	}
	// The kubelet sends hugepage limits for every container: say so.
	// Nothing it sends needs the other optional ones.
	if hugetlb {
		r.Level = Warn
		r.Hint = "mount -t cgroup -o hugetlb hugetlb /sys/fs/cgroup/hugetlb if pods need hugepage limits enforced"
		if c.V2 {
			r.Hint = "enable hugetlb in cgroup.subtree_control down to " + c.Source + " if pods need hugepage limits enforced"
		}
	}
	return r
}

func checkIptables(ctx context.Context) Result {
	r := Result{Name: "iptables"}
	path, err := exec.LookPath("iptables")
	if err != nil {
		r.Level, r.Message = Warn, "iptables not found: port mappings and masquerade will fail"
		r.Hint = "apt-get install iptables"
		return r
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := exec.CommandContext(vctx, path, "--version").CombinedOutput()
	if err != nil {
		r.Level, r.Message = Warn, fmt.Sprintf("%s --version failed: %v", path, err)
		return r
	}
	r.Level, r.Message = OK, firstLine(string(v))
	return r
}

// checkCRIU warns (checkpoint/restore is optional) when the configured
// criu is missing or fails `criu check`.
func checkCRIU(ctx context.Context, cfg *config.Config) Result {
	r := Result{Name: "criu"}
	path, err := checkpoint.NewCRIU(cfg.CRIU).Usable(ctx)
	if err != nil {
		r.Level, r.Message = Warn, err.Error()+": CheckpointContainer, CheckpointPod and RestorePod will fail"
		r.Hint = "install a criu that passes `criu check` on this kernel, or set `criu` to one (docs/checkpoint.md)"
		return r
	}
	r.Level, r.Message = OK, path+": criu check passed"
	return r
}

func checkNamespaces() Result {
	r := Result{Name: "namespaces", Level: OK}
	var missing []string
	for _, ns := range []string{"net", "ipc", "uts", "pid", "mnt", "cgroup"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			missing = append(missing, ns)
		}
	}
	if len(missing) > 0 {
		r.Level, r.Message = Fail, "kernel lacks namespaces: "+strings.Join(missing, " ")
		r.Hint = "use a kernel built with CONFIG_NAMESPACES and these namespace types"
		return r
	}
	r.Message = "net ipc uts pid mnt cgroup"
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) != "0" {
		r.Message += " user"
	}
	return r
}

func checkSeccomp() Result {
	r := Result{Name: "seccomp"}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		r.Level, r.Message = Warn, err.Error()
		return r
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "Seccomp:") {
			r.Level, r.Message = OK, "supported"
			return r
		}
	}
	r.Level, r.Message = Warn, "the kernel does not report seccomp: RuntimeDefault profiles cannot apply"
	r.Hint = "use a kernel with CONFIG_SECCOMP_FILTER"
	return r
}

func checkPrivileges() Result {
	if os.Geteuid() != 0 {
		return Result{Name: "privileges", Level: Fail, Message: "not running as root",
			Hint: "berthd needs root for namespaces, mounts and cgroups"}
	}
	return Result{Name: "privileges", Level: OK, Message: "root"}
}

// checkDir verifies dir exists and is writable, or that its nearest
// existing parent is (berthd creates it on start).
func checkDir(what, dir string) Result {
	r := Result{Name: what}
	p := dir
	for {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				r.Level, r.Message = Fail, fmt.Sprintf("%s exists and is not a directory", p)
				r.Hint = "remove it or choose another path"
				return r
			}
			break
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	probe, err := os.CreateTemp(p, ".berth-doctor-")
	if err != nil {
		r.Level, r.Message = Fail, fmt.Sprintf("%s: cannot write in %s: %v", dir, p, err)
		r.Hint = "run as root, or fix the directory's permissions"
		return r
	}
	probe.Close()
	os.Remove(probe.Name())
	if p == dir {
		r.Level, r.Message = OK, dir+" is writable"
	} else {
		r.Level, r.Message = OK, fmt.Sprintf("%s will be created (in %s)", dir, p)
	}
	return r
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
