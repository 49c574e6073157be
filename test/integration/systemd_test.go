package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// privateSystemd is a systemd running as PID 1 of its own PID and mount
// namespaces ("systemd in a container"), with a private /run and its
// cgroup root at Root (a cgroup of its own in the host's hierarchies). On
// a node booted with systemd, the node's own systemd is used instead.
type privateSystemd struct {
	Pid  int    // systemd's pid in the host's PID namespace; 0: the host's systemd
	Root string // systemd's cgroup root below the hierarchy roots ("/" for the host's)
}

const systemdBinary = "/lib/systemd/systemd"

// startPrivateSystemd boots a private systemd, or skips the test (saying
// why) where that cannot be done.
func startPrivateSystemd(t *testing.T) *privateSystemd {
	t.Helper()
	berthdtest.RequireRoot(t)
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		return &privateSystemd{Root: "/"}
	}
	for _, bin := range []string{systemdBinary, "/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/systemctl"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("systemd is not running and %s is missing: cannot start a private systemd", bin)
		}
	}
	// systemd's root: a fresh cgroup, the same in every hierarchy (systemd
	// manages a v1 controller only where its name=systemd root exists in
	// that hierarchy too), so that all it makes goes away with it.
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
		if _, err := os.Stat("/sys/fs/cgroup/systemd/cgroup.procs"); err != nil {
			t.Skip("cgroup v1 without a name=systemd hierarchy: a private systemd cannot track units")
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := "/berthsd" + hex.EncodeToString(b)
	sd := &privateSystemd{Root: root}
	t.Cleanup(func() { removeCgroupTree(t, root) })
	var join strings.Builder
	for _, h := range cgroupHierarchyRoots() {
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("create systemd's cgroup root: %v", err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, _ := os.ReadFile(filepath.Join(h, f))
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					t.Fatalf("fill %s: %v", f, err)
				}
			}
		}
		fmt.Fprintf(&join, "echo $$ > %s/cgroup.procs && ", dir)
	}

	// Inside: a private /run holding only a target with no dependencies,
	// so systemd starts nothing of the node's own units.
	boot := `mount --make-rprivate / && mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && ` +
		`printf '[Unit]\nDescription=berth test\nDefaultDependencies=no\n' > /run/systemd/system/berth-test.target && ` +
		`exec env container=berth ` + systemdBinary + ` --unit=berth-test.target --log-target=console`
	var logs bytes.Buffer
	cmd := exec.Command("/bin/sh", "-c", join.String()+"exec unshare --pid --mount --fork --mount-proc /bin/sh -c \""+boot+"\"")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("start a private systemd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		if sd.Pid > 0 {
			// SIGKILL to a PID namespace's init ends every process in it,
			// and with them the namespace's mounts.
			_ = unix.Kill(sd.Pid, unix.SIGKILL)
		}
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		<-done
	})

	deadline := time.Now().Add(30 * time.Second)
	for ; ; time.Sleep(100 * time.Millisecond) {
		select {
		case <-done:
			t.Skipf("a private systemd could not be started here; output:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Skipf("a private systemd did not come up in 30s; output:\n%s", logs.String())
		}
		if sd.Pid == 0 {
			children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
			if f := strings.Fields(string(children)); len(f) > 0 {
				sd.Pid, _ = strconv.Atoi(f[0])
			}
			continue
		}
		if out, err := sd.systemctl("is-system-running"); err == nil || strings.Contains(out, "degraded") {
			return sd
		}
	}
}

// systemctl runs systemctl against this systemd.
func (sd *privateSystemd) systemctl(args ...string) (string, error) {
	var cmd *exec.Cmd
	if sd.Pid == 0 {
		cmd = exec.Command("systemctl", args...)
	} else {
		cmd = exec.Command("nsenter", append([]string{"-t", strconv.Itoa(sd.Pid), "-m", "-p", "--", "systemctl"}, args...)...)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// startProcess starts berthd in systemd's PID and mount namespaces: the
// PID namespace by setns on a locked thread that forks berthd (and is then
// thrown away), the mount namespace by nsenter, which execs berthd without
// forking, so signals reach berthd itself.
func (sd *privateSystemd) startProcess(cmd *exec.Cmd) error {
	if sd.Pid == 0 {
		return cmd.Start()
	}
	cmd.Args = append([]string{"nsenter", "--mount=/proc/" + strconv.Itoa(sd.Pid) + "/ns/mnt", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/usr/bin/nsenter"
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		fd, err := unix.Open("/proc/"+strconv.Itoa(sd.Pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWPID); err != nil {
			errc <- fmt.Errorf("enter systemd's PID namespace: %w", err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// cgroupHierarchyRoots lists the mounted hierarchies: the unified root on
// v2, every v1 hierarchy (and the unified one of hybrid) otherwise.
func cgroupHierarchyRoots() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue // cpu -> cpu,cpuacct style links
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// cgroupDirs lists path in every mounted hierarchy where it exists.
func cgroupDirs(path string) []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	var out []string
	for _, r := range roots {
		if fi, err := os.Stat(filepath.Join(r, path)); err == nil && fi.IsDir() {
			out = append(out, filepath.Join(r, path))
		}
	}
	return out
}

func removeCgroupTree(t *testing.T, root string) {
	for _, top := range cgroupDirs(root) {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for try := 0; try < 50; try++ {
				if err := unix.Rmdir(dirs[i]); err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if _, err := os.Stat(top); err == nil {
			t.Logf("cgroup %s left behind", top)
		}
	}
}

func readCgroupFile(t *testing.T, hierarchy, group, file string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", hierarchy, group, file))
	if err != nil {
		t.Fatalf("read %s of %s: %v", file, group, err)
	}
	return strings.TrimSpace(string(data))
}

// unitsOf lists the loaded units matching pattern.
func (sd *privateSystemd) unitsOf(t *testing.T, pattern string) []string {
	t.Helper()
	return sd.units(t, pattern)
}

// cgroupUnitsOf lists the loaded slices and scopes whose name holds id
// (systemd also mirrors berth's mounts as .mount units; those are not
// berth's to remove).
func (sd *privateSystemd) cgroupUnitsOf(t *testing.T, id string) []string {
	t.Helper()
	return sd.units(t, "*"+id+"*.slice", "*"+id+"*.scope")
}

func (sd *privateSystemd) units(t *testing.T, patterns ...string) []string {
	t.Helper()
	out, err := sd.systemctl(append([]string{"list-units", "--all", "--plain", "--no-legend"}, patterns...)...)
	if err != nil {
		t.Fatalf("systemctl list-units: %v: %s", err, out)
	}
	var units []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units
}

// The systemd cgroup driver end to end against a real systemd: the pod's
// slice, containers' scopes (runc --systemd-cgroup), stats, resource
// updates of the scope and the slice, exec, OOM, removal leaving no unit or
// cgroup, and a restarted berthd stopping a slice nobody owns.
func TestSystemdCgroupDriver(t *testing.T) {
	sd := startPrivateSystemd(t)
	d := berthdtest.Start(t, berthdtest.Options{
		Configure:    func(c *config.Config) { c.CgroupDriver = "systemd" },
		StartProcess: sd.startProcess,
	})
	rc, err := d.Runtime.RuntimeConfig(ctxT(t), &criapi.RuntimeConfigRequest{})
	if err != nil || rc.GetLinux().GetCgroupDriver() != criapi.CgroupDriver_SYSTEMD {
		t.Fatalf("RuntimeConfig = %v, %v; want SYSTEMD", rc, err)
	}
	if out, code := runBerthctl(t, "--address", "unix://"+d.Socket, "info"); code != 0 || !strings.Contains(out, "cgroups:    systemd driver") {
		t.Fatalf("berthctl info (exit %d) does not show the systemd driver:\n%s", code, out)
	}
	e := newCtrEnvOn(t, d)
	ctx := ctxT(t)

	// The pod: a slice below the default parent, realised in the memory
	// hierarchy (stats and limits need it there on v1).
	_, info := podStatus(t, d, e.pod)
	wantUnit := d.Config.CgroupParent + "-berthpod_" + e.pod + ".slice"
	if info.CgroupUnit != wantUnit {
		t.Fatalf("pod unit %q, want %q", info.CgroupUnit, wantUnit)
	}
	if out, err := sd.systemctl("is-active", wantUnit); err != nil || out != "active" {
		t.Fatalf("pod slice %s: %q, %v", wantUnit, out, err)
	}
	if !strings.HasPrefix(info.CgroupParent, sd.Root) || !strings.HasSuffix(info.CgroupParent, "/"+wantUnit) {
		t.Fatalf("pod cgroup %q is not the slice's place below systemd's root %s", info.CgroupParent, sd.Root)
	}
	if len(cgroupDirs(info.CgroupParent)) == 0 {
		t.Fatalf("pod cgroup %s exists in no hierarchy", info.CgroupParent)
	}

	// A container: runc makes berth-<id>.scope in the pod slice.
	cfg := e.config("sleeper", "sleep", "1000")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, CpuShares: 512}
	ctr := e.run(cfg)
	scope := "berth-" + ctr + ".scope"
	if out, err := sd.systemctl("is-active", scope); err != nil || out != "active" {
		t.Fatalf("container scope %s: %q, %v", scope, out, err)
	}
	if out, _ := sd.systemctl("show", "-p", "Slice", "--value", scope); out != wantUnit {
		t.Fatalf("scope %s is in slice %q, want %q", scope, out, wantUnit)
	}
	scopeGroup := filepath.Join(info.CgroupParent, scope)
	memFile, memHier := "memory.limit_in_bytes", "memory"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		memFile, memHier = "memory.max", ""
	}
	if got := readCgroupFile(t, memHier, scopeGroup, memFile); got != strconv.Itoa(64<<20) {
		t.Fatalf("scope memory limit %s, want %d", got, 64<<20)
	}

	// On v1 the init is in its scope's devices cgroup, where runc's device
	// rules are, not in the pod slice's (where systemd moves the first
	// such scope below a new parent; the shim moves it back).
	if procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/systemd", scopeGroup, "cgroup.procs")); err == nil {
		pids := strings.Fields(string(procs))
		if len(pids) == 0 {
			t.Fatalf("no process in scope %s", scope)
		}
		for _, pid := range pids {
			data, err := os.ReadFile("/proc/" + pid + "/cgroup")
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, ":devices:") && !strings.HasSuffix(line, "/"+scope) {
					t.Fatalf("container process %s is in devices cgroup %q, not its scope's", pid, line)
				}
			}
		}
	}

	// Stats read the scope's real cgroup (below systemd's root here).
	st := containerStats(t, d, ctr)
	if st.GetMemory().GetWorkingSetBytes().GetValue() == 0 || st.GetCpu().GetUsageCoreNanoSeconds() == nil {
		t.Fatalf("container stats without memory or CPU: %v", st)
	}
	if ps := podStats(t, d, e.pod); ps.GetLinux().GetMemory().GetWorkingSetBytes().GetValue() == 0 {
		t.Fatalf("pod stats without memory: %v", ps)
	}

	// UpdateContainerResources goes through runc update to the scope.
	if _, err := d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{
		ContainerId: ctr, Linux: &criapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20, CpuShares: 512},
	}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	if got := readCgroupFile(t, memHier, scopeGroup, memFile); got != strconv.Itoa(128<<20) {
		t.Fatalf("scope memory limit after update %s, want %d", got, 128<<20)
	}

	// Pod-level limits become slice properties.
	if _, err := d.Runtime.UpdatePodSandboxResources(ctx, &criapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: e.pod, Resources: &criapi.LinuxContainerResources{MemoryLimitInBytes: 512 << 20},
	}); err != nil {
		t.Fatalf("UpdatePodSandboxResources: %v", err)
	}
	if got := readCgroupFile(t, memHier, info.CgroupParent, memFile); got != strconv.Itoa(512<<20) {
		t.Fatalf("pod slice memory limit %s, want %d", got, 512<<20)
	}

	// Exec runs in the container (and its scope).
	ex, err := d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"cat", "/proc/self/cgroup"}, Timeout: 10})
	// On v2 the container has a cgroup namespace rooted at its scope: it
	// sees "0::/" (the host side is checked through the scope's procs).
	inScope := strings.Contains(string(ex.Stdout), scope) || cgroupV2() && strings.TrimSpace(string(ex.Stdout)) == "0::/"
	if err != nil || ex.ExitCode != 0 || !inScope {
		t.Fatalf("ExecSync: %v, exit %d, out %q; want the scope %s", err, ex.GetExitCode(), ex.GetStdout(), scope)
	}

	// OOM is still seen through the scope's memory cgroup.
	oomCfg := e.config("oom", "sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")
	oomCfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}
	oom := e.run(oomCfg)
	if s := e.waitExited(oom); s.Reason != "OOMKilled" {
		t.Fatalf("OOM container: reason %q exit %d, want OOMKilled", s.Reason, s.ExitCode)
	}

	// Removal stops the scopes and the slice: no unit, no cgroup left.
	for _, id := range []string{ctr, oom} {
		if _, err := d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
			t.Fatalf("StopContainer: %v", err)
		}
		if _, err := d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("RemoveContainer: %v", err)
		}
	}
	stopRemove(t, d, e.pod)
	if left := sd.cgroupUnitsOf(t, e.pod); len(left) > 0 {
		t.Fatalf("units left after the pod was removed: %v", left)
	}
	for _, id := range []string{ctr, oom} {
		if left := sd.cgroupUnitsOf(t, id); len(left) > 0 {
			t.Fatalf("units left after the container was removed: %v", left)
		}
	}
	if left := cgroupDirs(info.CgroupParent); len(left) > 0 {
		t.Fatalf("pod cgroup left: %v", left)
	}

	// A shared PID namespace: berth-pause runs in a scope of its own in
	// the pod slice (a slice cannot hold processes), gone with the pod.
	shared := podConfig("systemd-sharedpid")
	shared.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	sharedPod := runPod(t, d, shared)
	pauseScope := "berth-pause-" + sharedPod + ".scope"
	if out, _ := sd.systemctl("show", "-p", "Slice", "--value", pauseScope); out != d.Config.CgroupParent+"-berthpod_"+sharedPod+".slice" {
		t.Fatalf("pause scope %s is in slice %q", pauseScope, out)
	}
	stopRemove(t, d, sharedPod)
	if left := sd.cgroupUnitsOf(t, sharedPod); len(left) > 0 {
		t.Fatalf("units left after the shared-PID pod was removed: %v", left)
	}

	// berthd dies after making the slice (and the CNI ADD it overlaps,
	// decision 1602; checkpoint NOTREADY): the restarted daemon lists the
	// pod, and removing it stops the slice.
	d.Stop()
	d.SetEnv(fault.EnvVar + "=" + string(fault.SandboxAfterCNIAdd))
	d.Start()
	d.WaitReady()
	if _, err := d.Runtime.RunPodSandbox(ctxT(t), &criapi.RunPodSandboxRequest{Config: podConfig("systemd-crash")}); err == nil {
		t.Fatalf("RunPodSandbox succeeded though berthd was to die")
	}
	select {
	case <-d.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("berthd did not die at the fault point")
	}
	d.SetEnv()
	d.Start()
	d.WaitReady()
	pods, err := d.Runtime.ListPodSandbox(ctxT(t), &criapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods after the crash: %v, %v; want the crashed one", pods, err)
	}
	crashed := pods.Items[0].Id
	if len(sd.cgroupUnitsOf(t, crashed)) != 1 {
		t.Fatalf("the crashed pod's slice is not there: %v", sd.cgroupUnitsOf(t, crashed))
	}
	stopRemove(t, d, crashed)
	if left := sd.cgroupUnitsOf(t, crashed); len(left) > 0 {
		t.Fatalf("units left after removing the crashed pod: %v", left)
	}

	// A failed RunPodSandbox (CNI ADD fails after the slice exists) stops
	// the slice it made.
	conf := filepath.Join(d.Config.CNIConfDir, "10-broken.conflist")
	if err := os.MkdirAll(d.Config.CNIConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(`{"cniVersion":"1.0.0","name":"broken","plugins":[{"type":"berth-no-such-plugin"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = d.Runtime.RunPodSandbox(ctxT(t), &criapi.RunPodSandboxRequest{Config: podConfig("systemd-cnifail")})
	if err == nil {
		t.Fatalf("RunPodSandbox succeeded with a CNI plugin that does not exist")
	}
	// CNI ADD runs after the slice was made.
	if !strings.Contains(err.Error(), "CNI ADD") {
		t.Fatalf("RunPodSandbox did not fail in CNI ADD: %v", err)
	}
	if left := sd.units(t, d.Config.CgroupParent+"-berthpod_*.slice"); len(left) > 0 {
		t.Fatalf("slice left by the failed RunPodSandbox: %v", left)
	}
	if err := os.Remove(conf); err != nil {
		t.Fatal(err)
	}

	// A pod slice no checkpoint owns (its records lost while berthd was
	// down) is stopped by the next start.
	lost := runPod(t, d, podConfig("systemd-lost"))
	lostUnit := d.Config.CgroupParent + "-berthpod_" + lost + ".slice"
	_, lostInfo := podStatus(t, d, lost)
	if len(sd.unitsOf(t, lostUnit)) != 1 || len(cgroupDirs(lostInfo.CgroupParent)) == 0 {
		t.Fatalf("pod slice %s not there before the restart", lostUnit)
	}
	d.Stop()
	for _, dir := range []string{filepath.Join(d.Root, "sandboxes", lost)} {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
	d.Start()
	d.WaitReady()
	if left := sd.unitsOf(t, lostUnit); len(left) > 0 {
		t.Fatalf("orphan pod slice %s still loaded after restart", lostUnit)
	}
	if left := cgroupDirs(lostInfo.CgroupParent); len(left) > 0 {
		t.Fatalf("orphan pod cgroup left after restart: %v", left)
	}
	if !strings.Contains(d.Logs(), "stopping a pod slice without a sandbox") {
		t.Fatalf("orphan slice cleanup not logged")
	}
}

// On a node without systemd, berthd with cgroup_driver = "systemd" refuses
// to start and says why, instead of failing every RunPodSandbox.
func TestSystemdDriverRefusedWithoutSystemd(t *testing.T) {
	berthdtest.RequireRoot(t)
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		t.Skip("systemd runs this node")
	}
	t.Parallel()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Root, cfg.State = filepath.Join(dir, "root"), filepath.Join(dir, "state")
	cfg.Listen = "unix://" + filepath.Join(dir, "b.sock")
	cfg.CNIConfDir = filepath.Join(dir, "net.d")
	cfg.CgroupDriver = "systemd"
	data, err := cfg.TOML()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "berth.toml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, berthdtest.Binary(t), "--config", filepath.Join(dir, "berth.toml")).CombinedOutput()
	if err == nil {
		t.Fatalf("berthd started with the systemd driver on a node without systemd:\n%s", out)
	}
	if !strings.Contains(string(out), "systemd is not running") || !strings.Contains(string(out), "/run/systemd/system") {
		t.Fatalf("berthd's refusal does not name the problem:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.sock")); err == nil {
		t.Fatalf("socket left behind after the refusal")
	}
}
