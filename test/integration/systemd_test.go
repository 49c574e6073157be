package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

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
	rc, err := d.Runtime.RuntimeConfig(berthdtest.Ctx(t), &criapi.RuntimeConfigRequest{})
	if err != nil || rc.GetLinux().GetCgroupDriver() != criapi.CgroupDriver_SYSTEMD {
		t.Fatalf("RuntimeConfig = %v, %v; want SYSTEMD", rc, err)
	}
	if out, code := runBerthctl(t, "--address", "unix://"+d.Socket, "info"); code != 0 || !strings.Contains(out, "cgroups:    systemd driver") {
		t.Fatalf("berthctl info (exit %d) does not show the systemd driver:\n%s", code, out)
	}
	e := newCtrEnvOn(t, d)
	ctx := berthdtest.Ctx(t)

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
	if _, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig("systemd-crash")}); err == nil {
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
	pods, err := d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
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
	_, err = d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig("systemd-cnifail")})
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
