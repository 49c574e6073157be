package integration

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// kubeletDefaultMasked and kubeletDefaultReadonly are the lists the
// kubelet sends for procMount: Default (pkg/securitycontext, v1.37).
var (
	kubeletDefaultMasked = []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	kubeletDefaultReadonly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// procView is what the node e2e ProcMount spec looks at (`mount | grep
// /proc`): how many mounts at or below /proc, and how many of them are
// read-only. Unmasked: only /proc itself, read-write; masked: /proc/kcore,
// /proc/sys and the others over it, the read-only paths read-only.
const procView = `grep ' /proc' /proc/mounts | wc -l; grep ' /proc' /proc/mounts | grep -c ' ro[ ,]'; true`

// For procMount: Unmasked the kubelet sends empty masked and read-only
// lists, which arrive over gRPC as unset: a container of a user
// namespace pod then sees /proc unmasked. The kubelet's default lists keep /proc
// masked in the same pod, and a container of a pod without a user
// namespace that sends no lists (crictl) keeps containerd's defaults.
func TestUsernsProcMountUnmasked(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_POD)

	view := func(e *ctrEnv, cfg *criapi.ContainerConfig) string {
		t.Helper()
		id := e.run(cfg)
		return execOut(t, e, id, "sh", "-c", procView)
	}
	unmasked := e.usernsCtrConfig("unmasked", "sleep", "3600")
	// What the kubelet sends; on the wire both lists are absent.
	unmasked.Linux.SecurityContext.MaskedPaths, unmasked.Linux.SecurityContext.ReadonlyPaths = []string{}, []string{}
	if got := view(e, unmasked); got != "1\n0\n" {
		t.Errorf("Unmasked container in a user namespace pod: /proc mounts, read-only ones: %q, want 1, 0", got)
	}

	masked := e.usernsCtrConfig("default", "sleep", "3600")
	masked.Linux.SecurityContext.MaskedPaths, masked.Linux.SecurityContext.ReadonlyPaths = kubeletDefaultMasked, kubeletDefaultReadonly
	got := strings.Fields(view(e, masked))
	if len(got) != 2 || got[0] == "1" || got[1] == "0" {
		t.Errorf("Default container in a user namespace pod: /proc mounts, read-only ones: %q, want >1, >0", got)
	}

	plainCfg := podConfig("procmount-plain")
	plainCfg.LogDirectory = e.logDir
	plain := &ctrEnv{t: t, d: e.d, reg: e.reg, logDir: e.logDir, podCfg: plainCfg, pod: runPod(t, e.d, plainCfg)}
	got = strings.Fields(view(plain, plain.config("unset", "sleep", "3600")))
	if len(got) != 2 || got[0] == "1" || got[1] == "0" {
		t.Errorf("container without lists in a host user namespace pod: %q, want >1, >0", got)
	}
	stopRemove(t, e.d, plain.pod)
}

// defaultRouteInterface is the host's interface with the default route
// ("" when none): one that stays while the test runs, unlike veths of
// other tests.
func defaultRouteInterface(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "00000000" {
			return f[0]
		}
	}
	return ""
}

// A hostUsers: false pod on the host's network (KEP-5607): Status
// reports the feature; the pod runs, with and without a shared PID
// namespace; its container is in the host's network namespace and sees
// the host's interfaces (in /proc/net and in /sys, which is the host's
// bound read-only, every submount too, since a user namespace that does
// not own the network namespace cannot mount a sysfs), the host's name,
// and the kubelet's mapping; its pod files belong to its root. Host IPC
// or PID stay refused. Removing the pods leaves nothing.
func TestUsernsHostNetwork(t *testing.T) {
	t.Parallel()
	e, scope, before := newUsernsLeakEnv(t, criapi.NamespaceMode_POD)
	ctx := berthdtest.Ctx(t)

	resp, err := e.d.Runtime.Status(ctx, &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetFeatures().GetUserNamespacesHostNetwork() {
		t.Fatalf("features %+v: user_namespaces_host_network false on a node that runs user namespace pods", resp.GetFeatures())
	}

	for name, set := range map[string]func(*criapi.NamespaceOption){
		"ipc": func(o *criapi.NamespaceOption) { o.Ipc = criapi.NamespaceMode_NODE },
		"pid": func(o *criapi.NamespaceOption) { o.Pid = criapi.NamespaceMode_NODE },
	} {
		cfg := usernsPodConfig("refused-host-"+name, criapi.NamespaceMode_CONTAINER)
		cfg.Linux.SecurityContext.NamespaceOptions.Network = criapi.NamespaceMode_NODE
		set(cfg.Linux.SecurityContext.NamespaceOptions)
		_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
		t.Logf("host %s: %v", name, err)
		berthdtest.WantCode(t, err, codes.InvalidArgument)
	}

	// The host's network namespace, read from this goroutine's own thread:
	// /proc/self names the main thread, which a parallel test may have
	// moved into a pod's namespace (inNamespace) for a moment; berthd's
	// pid may be one of a PID namespace of its own (the systemd driver's
	// harness).
	hostNetNS, err := threadNetNS()
	if err != nil {
		t.Fatal(err)
	}
	hostName, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	iface := defaultRouteInterface(t)
	for _, pid := range []criapi.NamespaceMode{criapi.NamespaceMode_CONTAINER, criapi.NamespaceMode_POD} {
		e.podCfg = usernsPodConfig(fmt.Sprintf("userns-hostnet-%d", pid), pid)
		e.podCfg.LogDirectory = e.logDir
		e.podCfg.Linux.SecurityContext.NamespaceOptions.Network = criapi.NamespaceMode_NODE
		e.pod = runPod(t, e.d, e.podCfg)
		_, info := podStatus(t, e.d, e.pod)
		if info.NetNSPath != "" {
			t.Errorf("host network pod has a network namespace %q", info.NetNSPath)
		}
		c := e.usernsCtrConfig("hostnet", "sleep", "3600")
		c.Linux.SecurityContext.NamespaceOptions.Network = criapi.NamespaceMode_NODE
		c.Linux.SecurityContext.NamespaceOptions.Pid = pid
		id := e.run(c)

		if got := strings.TrimSpace(execOut(t, e, id, "readlink", "/proc/self/ns/net")); got != hostNetNS {
			t.Errorf("pid %s: container network namespace %s, host's %s", pid, got, hostNetNS)
		}
		if got := strings.TrimSpace(execOut(t, e, id, "hostname")); got != hostName {
			t.Errorf("pid %s: hostname %q, host's %q", pid, got, hostName)
		}
		maps := strings.Split(strings.TrimSpace(execOut(t, e, id, "cat", "/proc/self/uid_map", "/proc/self/gid_map")), "\n")
		if len(maps) != 2 || !mapLine.MatchString(maps[0]) || !mapLine.MatchString(maps[1]) {
			t.Errorf("pid %s: uid_map/gid_map %q", pid, maps)
		}
		if iface != "" {
			netDev := execOut(t, e, id, "cat", "/proc/net/dev")
			sysNet := strings.Fields(execOut(t, e, id, "ls", "/sys/class/net"))
			if !strings.Contains(netDev, " "+iface+":") && !strings.Contains(netDev, "\n"+iface+":") {
				t.Errorf("pid %s: host interface %s not in the container's /proc/net/dev:\n%s", pid, iface, netDev)
			}
			if !strings.Contains(" "+strings.Join(sysNet, " ")+" ", " "+iface+" ") {
				t.Errorf("pid %s: host interface %s not in the container's /sys/class/net: %q", pid, iface, sysNet)
			}
		}
		// /sys and everything below it is read-only, but for runc's own
		// cgroup mount over /sys/fs/cgroup (as in every pod).
		var sys []string
		for _, line := range strings.Split(execOut(t, e, id, "cat", "/proc/mounts"), "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || (f[1] != "/sys" && !strings.HasPrefix(f[1], "/sys/")) || f[1] == "/sys/fs/cgroup" || strings.HasPrefix(f[1], "/sys/fs/cgroup/") {
				continue
			}
			sys = append(sys, line)
			if !strings.HasPrefix(f[3], "ro,") && f[3] != "ro" {
				t.Errorf("pid %s: writable mount under /sys: %s", pid, line)
			}
		}
		if len(sys) == 0 {
			t.Errorf("pid %s: no /sys mount", pid)
		}
		out := execOut(t, e, id, "sh", "-c", "id -u; stat -c '%u:%g' /etc/hosts /etc/resolv.conf /etc/hostname /dev/shm; grep -c ' /dev/mqueue mqueue' /proc/mounts")
		if out != "0\n0:0\n0:0\n0:0\n0:0\n1\n" {
			t.Errorf("pid %s: uid, pod files, shm and mqueue: %q", pid, out)
		}
		if pid == criapi.NamespaceMode_POD {
			// A berthd restart keeps the pod: its pins (user, IPC) and
			// pause process hold, and a new container joins them.
			userNS := execOut(t, e, id, "readlink", "/proc/self/ns/user")
			e.d.Restart()
			if st, _ := podStatus(t, e.d, e.pod); st.State != criapi.PodSandboxState_SANDBOX_READY {
				t.Fatalf("pod %s after restart", st.State)
			}
			c := e.usernsCtrConfig("next", "sleep", "3600")
			c.Linux.SecurityContext.NamespaceOptions.Network = criapi.NamespaceMode_NODE
			c.Linux.SecurityContext.NamespaceOptions.Pid = pid
			next := e.run(c)
			for _, ctr := range []string{id, next} {
				if got := execOut(t, e, ctr, "sh", "-c", "readlink /proc/self/ns/user; readlink /proc/self/ns/net"); got != userNS+hostNetNS+"\n" {
					t.Errorf("after restart, container %s: user and network namespaces %q, want %q and %q", ctr, got, userNS, hostNetNS)
				}
			}
		}
		stopRemove(t, e.d, e.pod)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if entries, _ := os.ReadDir(e.d.State + "/netns"); len(entries) != 0 {
		var names []string
		for _, en := range entries {
			names = append(names, en.Name())
		}
		t.Fatalf("namespace pins left: %q", names)
	}
}

// threadNetNS is the network namespace of the calling goroutine's thread,
// held for the read.
func threadNetNS() (string, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return os.Readlink("/proc/thread-self/ns/net")
}
