package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// The pod cgroup layout (docs/cgroups.md, internal/cgroupplan):
// a pod's holder process (berth-pause, run for a PID namespace shared by the
// pod and for a user namespace) sits in a cgroup of its own below the pod
// cgroup, never in the pod cgroup itself. On cgroup v2 a cgroup holding a
// process cannot have children with domain controllers, so a holder in the
// pod cgroup fails every CreateContainer ("cannot enter cgroupv2 ... with
// domain controllers -- it is in an invalid state"; decision 2200). On
// this v1 node these tests check the layout; on a v2 node they are the proof.

// checkV2NoInternalProcesses walks the pod cgroup on v2: every cgroup
// holding a process has no children and enables no domain controller for
// children, none is threaded or invalid, and the pod cgroup enables the
// controllers its containers need.
func checkV2NoInternalProcesses(t *testing.T, pod string) {
	t.Helper()
	if !cgroupV2() {
		return
	}
	top := filepath.Join("/sys/fs/cgroup", pod)
	sub := strings.Fields(readCgroupFile(t, "", pod, "cgroup.subtree_control"))
	for _, want := range []string{"cpu", "memory"} {
		if !slices.Contains(sub, want) {
			t.Errorf("pod cgroup %s enables %v for its containers, without %s", pod, sub, want)
		}
	}
	if _, err := os.Stat(filepath.Join(top, "memory.max")); err != nil {
		t.Errorf("pod cgroup has no memory.max: %v", err)
	}
	err := filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return err
		}
		rel := strings.TrimPrefix(p, "/sys/fs/cgroup")
		typ := readCgroupFile(t, "", rel, "cgroup.type")
		if typ != "domain" {
			t.Errorf("%s is %q, want domain", rel, typ)
		}
		procs := strings.Fields(readCgroupFile(t, "", rel, "cgroup.procs"))
		if len(procs) == 0 {
			return nil
		}
		for _, c := range strings.Fields(readCgroupFile(t, "", rel, "cgroup.subtree_control")) {
			if cgroupplan.Domain(c) {
				t.Errorf("%s holds %v and enables the domain controller %s for children", rel, procs, c)
			}
		}
		kids, _ := os.ReadDir(p)
		for _, k := range kids {
			if k.IsDir() {
				t.Errorf("%s holds %v and has the child %s", rel, procs, k.Name())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", top, err)
	}
}

// sharedPIDCtr is a container config of e's pod in the pod's PID namespace
// (what the kubelet sends for shareProcessNamespace: true).
func sharedPIDCtr(e *ctrEnv, name string, userns bool) *criapi.ContainerConfig {
	c := e.config(name, "sleep", "3600")
	if userns {
		c = e.usernsCtrConfig(name, "sleep", "3600")
	}
	c.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	return c
}

// checkHolderLayout runs two containers in e's pod (which has a holder)
// and checks where the holder and the containers sit. hierarchy picks the
// v1 hierarchy to read (memory for cgroupfs, name=systemd for systemd);
// holderCgroup is the holder's expected cgroup below the pod's.
// proc names /proc/<pid> for a pid berthd reports (in its own PID
// namespace).
func checkHolderLayout(t *testing.T, e *ctrEnv, userns bool, hierarchy, holderName string, ctrName func(id string) string, proc func(int) string) {
	t.Helper()
	_, info := podStatus(t, e.d, e.pod)
	if info.PIDNSPath == "" {
		t.Fatal("the pod has no holder (no PID namespace path)")
	}
	var holder int
	if _, err := fmt.Sscanf(info.PIDNSPath, "/proc/%d/ns/pid", &holder); err != nil {
		t.Fatalf("holder pid from %q: %v", info.PIDNSPath, err)
	}
	pod := info.CgroupParent
	holderCg := procCgroup(t, proc(holder), hierarchy)
	if holderCg == pod {
		t.Fatalf("the holder sits in the pod cgroup %s itself", pod)
	}
	if want := pod + "/" + holderName; holderCg != want {
		t.Fatalf("holder in %s, want %s", holderCg, want)
	}

	// The step a holder in the pod cgroup fails: CreateContainer, twice.
	c1 := e.run(sharedPIDCtr(e, "first", userns))
	c2 := e.run(sharedPIDCtr(e, "second", userns))
	holderNS, _ := os.Readlink(proc(holder) + "/ns/pid")
	for _, id := range []string{c1, c2} {
		if st := e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container %s is %s", id, st.State)
		}
		pid := proc(containerPid(t, e.d, id))
		if cg, want := procCgroup(t, pid, hierarchy), pod+"/"+ctrName(id); cg != want {
			t.Errorf("container %s in %s, want %s", id, cg, want)
		}
		if ns, _ := os.Readlink(pid + "/ns/pid"); ns != holderNS || ns == "" {
			t.Errorf("container %s in PID namespace %s, the pod's is %s", id, ns, holderNS)
		}
	}
	checkV2NoInternalProcesses(t, pod)

	stopRemove(t, e.d, e.pod)
	if dirs := cgroupDirs(pod); len(dirs) > 0 {
		t.Fatalf("pod cgroup left after RemovePodSandbox: %v", dirs)
	}
}

func cgroupfsCtrName(id string) string { return id }

// procIn is /proc/<pid> for a berthd running in the PID namespace whose
// init is host pid nsInit: its own /proc (unshare --mount-proc).
func procIn(nsInit int) func(int) string {
	if nsInit == 0 {
		return hostProc
	}
	return func(pid int) string { return fmt.Sprintf("/proc/%d/root/proc/%d", nsInit, pid) }
}

// CreateContainer in a shared-PID pod (pid namespace POD, so berth runs
// its holder): two containers run; the holder sits in <pod>/berth-pause.
func TestCgroupSharedPIDPodHolderHasOwnCgroup(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	stopRemove(t, e.d, e.pod)
	e.podCfg = podConfig("cg-sharedpid")
	e.podCfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	e.podCfg.LogDirectory = e.logDir
	e.pod = runPod(t, e.d, e.podCfg)
	checkHolderLayout(t, e, false, "memory", cgroupplan.HolderName, cgroupfsCtrName, hostProc)
}

// The same for user-namespace pods. With a PID namespace per container
// (what the kubelet sends for hostUsers: false) the holder that made the
// namespaces is gone once they are pinned: the pod cgroup holds only
// containers. With a shared PID namespace too, the holder stays, in
// <pod>/berth-pause.
func TestCgroupUsernsPodHolderHasOwnCgroup(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_CONTAINER)
	_, info := podStatus(t, e.d, e.pod)
	if info.PIDNSPath != "" {
		t.Fatalf("a pid CONTAINER pod reports a PID namespace %s", info.PIDNSPath)
	}
	hier := "memory"
	if cgroupV2() {
		hier = ""
	}
	if own := strings.Fields(readCgroupFile(t, hier, info.CgroupParent, "cgroup.procs")); len(own) > 0 {
		t.Fatalf("the pod cgroup itself holds %v", own)
	}
	c1 := e.run(e.usernsCtrConfig("first", "sleep", "3600"))
	c2 := e.run(e.usernsCtrConfig("second", "sleep", "3600"))
	for _, id := range []string{c1, c2} {
		if st := e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container %s is %s", id, st.State)
		}
	}
	checkV2NoInternalProcesses(t, info.CgroupParent)
	stopRemove(t, e.d, e.pod)
	if dirs := cgroupDirs(info.CgroupParent); len(dirs) > 0 {
		t.Fatalf("pod cgroup left after RemovePodSandbox: %v", dirs)
	}

	// And both namespaces at once: user namespace and a shared PID one.
	e.podCfg = usernsPodConfig("cg-userns-sharedpid", criapi.NamespaceMode_POD)
	e.podCfg.LogDirectory = e.logDir
	e.pod = runPod(t, e.d, e.podCfg)
	checkHolderLayout(t, e, true, "memory", cgroupplan.HolderName, cgroupfsCtrName, hostProc)
}

// A pod made by an older berthd had its holder in the pod cgroup itself:
// it still stops and goes without leaving a cgroup.
func TestCgroupOldLayoutPodTearsDownClean(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("cg-oldlayout")
	cfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	id := runPod(t, d, cfg)
	_, info := podStatus(t, d, id)
	var holder int
	fmt.Sscanf(info.PIDNSPath, "/proc/%d/ns/pid", &holder)
	pod := info.CgroupParent
	// Put the holder back where an older berthd put it.
	for _, root := range cgroupHierarchyRoots() {
		dir := filepath.Join(root, pod)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if cgroupV2() {
			for _, c := range strings.Fields(readCgroupFile(t, "", pod, "cgroup.subtree_control")) {
				if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("-"+c), 0o644); err != nil {
					t.Fatalf("disable %s in %s: %v", c, dir, err)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(fmt.Sprint(holder)), 0o644); err != nil {
			t.Fatalf("move the holder into %s: %v", dir, err)
		}
		if err := os.Remove(filepath.Join(dir, cgroupplan.HolderName)); err != nil {
			t.Fatalf("remove the holder's cgroup in %s: %v", dir, err)
		}
	}
	stopRemove(t, d, id)
	if dirs := cgroupDirs(pod); len(dirs) > 0 {
		t.Fatalf("old-layout pod cgroup left after RemovePodSandbox: %v", dirs)
	}
}

// Under the systemd driver (a private systemd on a node without one): the
// holder runs in the scope berth-pause-<id>.scope of the pod slice.
func TestCgroupSharedPIDPodHolderHasOwnCgroupSystemd(t *testing.T) {
	sd := startPrivateSystemd(t)
	d := berthdtest.Start(t, berthdtest.Options{
		Configure:    func(c *config.Config) { c.CgroupDriver = "systemd" },
		StartProcess: sd.startProcess,
	})
	e := newCtrEnvOn(t, d)
	stopRemove(t, e.d, e.pod)
	e.podCfg = podConfig("cg-sharedpid-sd")
	e.podCfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	e.podCfg.LogDirectory = e.logDir
	e.pod = runPod(t, e.d, e.podCfg)
	checkHolderLayout(t, e, false, "name=systemd", cgroupplan.HolderScope(e.pod), func(id string) string { return cgroupplan.ContainerScope(id) }, procIn(sd.Pid))
}
