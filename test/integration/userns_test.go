package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

func ownerOf(t *testing.T, path string) (uint32, uint32) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Uid, st.Gid
}

func execOut(t *testing.T, e *ctrEnv, id string, cmd ...string) string {
	t.Helper()
	r, err := execSync(t, e.d, id, 20, cmd...)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("exec %q: %v, exit %d, stdout %q, stderr %q", cmd, err, r.GetExitCode(), r.GetStdout(), r.GetStderr())
	}
	return string(r.Stdout)
}

var mapLine = regexp.MustCompile(`^\s*0\s+1000\s+100000\s*$`)

// The runtime reports user namespace support for every handler (critest
// runs its UserNamespaces specs only then) and names in its verbose
// config a stateDir whose parent is the filesystem holding the rootfs
// (critest probes idmapped mounts there).
func TestUsernsStatusReportsSupport(t *testing.T) {
	t.Parallel()
	d := startUsernsDaemon(t)
	resp, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.RuntimeHandlers) == 0 {
		t.Fatal("no runtime handlers")
	}
	for _, h := range resp.RuntimeHandlers {
		if !h.GetFeatures().GetUserNamespaces() {
			t.Errorf("handler %q: user_namespaces false", h.Name)
		}
	}
	var cfg struct {
		StateDir string `json:"stateDir"`
	}
	if err := json.Unmarshal([]byte(resp.Info["config"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(cfg.StateDir) != d.Root {
		t.Fatalf("stateDir %q: its parent is not --root %q", cfg.StateDir, d.Root)
	}
}

// A POD-mode pod (shared PID namespace, as critest asks) runs a container
// in a user namespace with exactly the kubelet's mapping; the namespace is
// berthd's pin, not the host's, and owns the pod's network, IPC, UTS and
// PID namespaces, so /proc, sysfs and mqueue mount inside. The pod's
// hostname, hosts, resolv.conf, /dev/shm and the container log work.
func TestUsernsPodContainerSeesMapping(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_POD)
	_, info := podStatus(t, e.d, e.pod)
	var raw map[string]any
	resp, err := e.d.Runtime.PodSandboxStatus(berthdtest.Ctx(t), &criapi.PodSandboxStatusRequest{PodSandboxId: e.pod, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &raw); err != nil {
		t.Fatal(err)
	}
	userPin, _ := raw["usernsPath"].(string)
	if userPin == "" || !strings.HasPrefix(userPin, e.d.State) {
		t.Fatalf("usernsPath %q not a pin under --state", userPin)
	}
	if info.PIDNSPath == "" {
		t.Fatal("pid POD pod has no shared PID namespace")
	}
	// Its holder, the pause process, is named for ps though started
	// through /proc/self/fd.
	if comm, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(info.PIDNSPath)), "comm")); err != nil || string(comm) != "berth-pause\n" {
		t.Fatalf("pause process comm %q, %v", comm, err)
	}

	// What critest's NamespaceMode_POD spec runs: cat /proc/self/uid_map.
	lines, st := e.output(e.usernsCtrConfig("uidmap", "cat", "/proc/self/uid_map", "/proc/self/gid_map"))
	if st.ExitCode != 0 || len(lines) != 2 || !mapLine.MatchString(lines[0]) || !mapLine.MatchString(lines[1]) {
		t.Fatalf("uid_map/gid_map: exit %d, %q", st.ExitCode, lines)
	}

	id := e.run(e.usernsCtrConfig("probe", "sleep", "3600"))
	// Its user namespace is the pinned one (same inode), not the host's.
	nsLink := strings.TrimSpace(execOut(t, e, id, "readlink", "/proc/self/ns/user"))
	var pinSt syscall.Stat_t
	if err := syscall.Stat(userPin, &pinSt); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("user:[%d]", pinSt.Ino); nsLink != want {
		t.Fatalf("container user namespace %s, pin is %s", nsLink, want)
	}
	if host, _ := os.Readlink("/proc/self/ns/user"); host == nsLink {
		t.Fatalf("container is in the host's user namespace %s", host)
	}
	// Mounts the kernel allows only over namespaces the user namespace
	// owns; runc makes them all.
	mounts := execOut(t, e, id, "cat", "/proc/mounts")
	for _, want := range []string{"proc /proc proc", "sysfs /sys sysfs", "mqueue /dev/mqueue mqueue", " /dev/shm tmpfs"} {
		if !strings.Contains(mounts, want) {
			t.Errorf("no %q in the container's mounts:\n%s", want, mounts)
		}
	}
	if got := strings.TrimSpace(execOut(t, e, id, "hostname")); got != e.podCfg.Hostname {
		t.Errorf("hostname %q, want %q", got, e.podCfg.Hostname)
	}
	// Pod files are the container root's; /dev/shm is writable.
	out := execOut(t, e, id, "sh", "-c", "stat -c '%u:%g' /etc/hosts /etc/resolv.conf /etc/hostname /dev/shm; echo ok >/dev/shm/f && cat /dev/shm/f; grep -q localhost /etc/hosts && echo hosts")
	if out != "0:0\n0:0\n0:0\n0:0\nok\nhosts\n" {
		t.Errorf("pod files and shm: %q", out)
	}
	if got := strings.TrimSpace(execOut(t, e, id, "id", "-u")); got != "0" {
		t.Errorf("container uid %s", got)
	}
	// On the host, the container's root is uid 1000.
	pid := containerPid(t, e.d, id)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^Uid:\s+1000\s+1000\s+1000\s+1000$`).Match(status) {
		t.Errorf("host view of the container's uids:\n%s", status)
	}
}

// Two containers of one pod share its user namespace; a read-only rootfs
// stays read-only; a container in a pod without one (userns mode NODE, as in critest's NODE spec) sees the
// host's mapping.
func TestUsernsContainersShareThePodNamespace(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_CONTAINER)
	a := e.run(e.usernsCtrConfig("a", "sleep", "3600"))
	b := e.run(e.usernsCtrConfig("b", "sleep", "3600"))
	nsA := execOut(t, e, a, "readlink", "/proc/self/ns/user")
	nsB := execOut(t, e, b, "readlink", "/proc/self/ns/user")
	if nsA != nsB || !strings.HasPrefix(nsA, "user:[") {
		t.Fatalf("containers in one pod: user namespaces %q and %q", nsA, nsB)
	}
	// Their own PID namespaces (mode CONTAINER) still belong to the pod's
	// user namespace: /proc is mounted and shows only their processes.
	if ps := execOut(t, e, a, "sh", "-c", "ls -d /proc/[0-9]* | wc -l"); strings.TrimSpace(ps) == "0" {
		t.Fatalf("no processes in /proc: %q", ps)
	}

	// A read-only rootfs stays read-only for the namespace's root.
	ro := e.usernsCtrConfig("ro", "sh", "-c", "touch /x 2>/dev/null && echo writable; echo ok >/dev/shm/ro && echo shm")
	ro.Linux.SecurityContext.ReadonlyRootfs = true
	if lines, st := e.output(ro); st.ExitCode != 0 || strings.Join(lines, ",") != "shm" {
		t.Fatalf("read-only rootfs: exit %d, %q", st.ExitCode, lines)
	}

	nodeCfg := podConfig("userns-node")
	nodeCfg.LogDirectory = e.logDir
	nodeCfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &criapi.UserNamespace{Mode: criapi.NamespaceMode_NODE}
	node := &ctrEnv{t: t, d: e.d, reg: e.reg, logDir: e.logDir, podCfg: nodeCfg, pod: runPod(t, e.d, nodeCfg)}
	lines, st := node.output(node.usernsCtrConfig("hostmap", "cat", "/proc/self/uid_map"))
	host, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitCode != 0 || len(lines) != 1 || strings.Join(strings.Fields(lines[0]), " ") != strings.Join(strings.Fields(string(host)), " ") {
		t.Fatalf("NODE pod uid_map %q, host %q", lines, host)
	}
}

// Writes by the container's root land on disk as the mapped host uid in
// its rootfs (upper dir) and in a plain host-path volume, and, through an
// idmapped volume (a mount with the pod's mappings, as the kubelet sends),
// as the host owner the idmap maps container root to (host root), in a
// directory only host root can write.
func TestUsernsWritesLandAsMappedOwner(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_CONTAINER)
	plain := filepath.Join(e.d.Dir, "plain-vol")
	idmapped := filepath.Join(e.d.Dir, "idmapped-vol")
	for _, dir := range []string{plain, idmapped} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// An emptyDir-like dir anyone may write; the idmapped one only root.
	if err := os.Chmod(plain, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(idmapped, "hostfile"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := e.usernsCtrConfig("writer", "sh", "-c", "echo r >/rootfs-file && echo p >/plain/f && echo i >/idmapped/f && "+
		"stat -c '%u' /idmapped/hostfile /plain && ls -ld / | cut -c1-10")
	cfg.Mounts = []*criapi.Mount{
		{ContainerPath: "/plain", HostPath: plain},
		{ContainerPath: "/idmapped", HostPath: idmapped, UidMappings: usernsMapping, GidMappings: usernsMapping},
	}
	id := e.run(cfg)
	st := e.waitExited(id)
	var lines []string
	for _, r := range readCRILog(t, st.LogPath) {
		lines = append(lines, r.msg)
	}
	// Inside: host root's file in the idmapped volume is root's; the
	// plain volume (host root's) is nobody's, as it is not idmapped.
	if st.ExitCode != 0 || len(lines) != 3 || lines[0] != "0" || lines[1] != "65534" || lines[2] != "drwxr-xr-x" {
		t.Fatalf("writer: exit %d, output %q", st.ExitCode, lines)
	}
	upper := filepath.Join(e.d.Root, "containers", id, "upper")
	for _, c := range []struct {
		path     string
		uid, gid uint32
	}{
		{upper, 1000, 1000},
		{filepath.Join(upper, "rootfs-file"), 1000, 1000},
		{filepath.Join(plain, "f"), 1000, 1000},
		{filepath.Join(idmapped, "f"), 0, 0},
	} {
		if uid, gid := ownerOf(t, c.path); uid != c.uid || gid != c.gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", c.path, uid, gid, c.uid, c.gid)
		}
	}
	// The idmapped copy lives while the container does.
	if _, err := os.Stat(filepath.Join(e.d.Root, "containers", id, "idmounts")); err != nil {
		t.Fatalf("idmapped mounts dir: %v", err)
	}
	if !mountedBelow(t, filepath.Join(e.d.Root, "containers", id, "idmounts")) {
		t.Fatal("no idmapped mount for the volume")
	}
}

func mountedBelow(t *testing.T, dir string) bool {
	t.Helper()
	m, err := berthdtest.MountsBelow(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(m) > 0
}

// Bad user namespace options are InvalidArgument and leave nothing: more
// than one mapping, a mapping without container ID 0, modes CONTAINER and
// TARGET (critest's four), plus mappings with mode NODE, a user namespace
// with host IPC, and a container asking for a user namespace its
// pod does not have; a pod failing after its namespaces were made. Then a
// pod whose container create fails (command
// not found, after its idmapped rootfs and volume were mounted) and a
// full pod lifecycle with an idmapped volume: removing the pod removes
// the namespace pin, the holder and every idmapped mount.
func TestUsernsRefusalsAndRemovalLeakNothing(t *testing.T) {
	t.Parallel()
	e, scope, before := newUsernsLeakEnv(t, criapi.NamespaceMode_POD)
	ctx := berthdtest.Ctx(t)

	two := []*criapi.IDMapping{usernsMapping[0], {ContainerId: 0, HostId: 2000, Length: 100000}}
	notZero := []*criapi.IDMapping{{ContainerId: 1, HostId: 1000, Length: 100000}}
	for name, u := range map[string]*criapi.UserNamespace{
		"two-mappings": {Mode: criapi.NamespaceMode_POD, Uids: two, Gids: two},
		"not-zero":     {Mode: criapi.NamespaceMode_POD, Uids: notZero, Gids: notZero},
		"container":    {Mode: criapi.NamespaceMode_CONTAINER},
		"target":       {Mode: criapi.NamespaceMode_TARGET},
		"node-mapped":  {Mode: criapi.NamespaceMode_NODE, Uids: usernsMapping, Gids: usernsMapping},
		"gid-missing":  {Mode: criapi.NamespaceMode_POD, Uids: usernsMapping},
	} {
		cfg := podConfig("refused-" + name)
		cfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = u
		_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
		t.Logf("%s: %v", name, err)
		berthdtest.WantCode(t, err, codes.InvalidArgument)
	}
	hostIPC := usernsPodConfig("refused-hostipc", criapi.NamespaceMode_CONTAINER)
	hostIPC.Linux.SecurityContext.NamespaceOptions.Ipc = criapi.NamespaceMode_NODE
	_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: hostIPC})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	// Fails after the namespaces were created and pinned (a sysctl value
	// the kernel rejects), with the holder kept as pause process.
	badSysctl := usernsPodConfig("failed-sysctl", criapi.NamespaceMode_POD)
	badSysctl.Linux.Sysctls = map[string]string{"net.ipv4.ip_local_port_range": "not numbers"}
	_, err = e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: badSysctl})
	if err == nil || !strings.Contains(err.Error(), "set sysctl") {
		t.Fatalf("pod with a bad sysctl value: %v", err)
	}
	pods, err := e.d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("refused pods listed: %v, %v", pods, err)
	}

	// A container may not ask for a user namespace its pod lacks.
	plainCfg := podConfig("userns-plain")
	plainCfg.LogDirectory = e.logDir
	plain := &ctrEnv{t: t, d: e.d, reg: e.reg, logDir: e.logDir, podCfg: plainCfg, pod: runPod(t, e.d, plainCfg)}
	c := plain.config("wants-userns", "true")
	c.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &criapi.UserNamespace{Mode: criapi.NamespaceMode_POD, Uids: usernsMapping, Gids: usernsMapping}
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: plain.pod, Config: c, SandboxConfig: plainCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	// Nor an idmapped mount.
	c = plain.config("wants-idmap", "true")
	c.Mounts = []*criapi.Mount{{ContainerPath: "/v", HostPath: e.d.Dir, UidMappings: usernsMapping, GidMappings: usernsMapping}}
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: plain.pod, Config: c, SandboxConfig: plainCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	stopRemove(t, e.d, plain.pod)

	vol := filepath.Join(e.d.Dir, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	e.podCfg = usernsPodConfig("userns-cycle", criapi.NamespaceMode_POD)
	e.podCfg.LogDirectory = e.logDir
	e.pod = runPod(t, e.d, e.podCfg)
	_, info := podStatus(t, e.d, e.pod)
	withVol := func(cfg *criapi.ContainerConfig) *criapi.ContainerConfig {
		cfg.Mounts = []*criapi.Mount{{ContainerPath: "/vol", HostPath: vol, UidMappings: usernsMapping, GidMappings: usernsMapping}}
		return cfg
	}
	// Fails in runc, after the idmapped rootfs and volume were made.
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: withVol(e.usernsCtrConfig("noexec", "/no/such/binary")), SandboxConfig: e.podCfg})
	if err == nil {
		t.Fatal("create with a missing binary succeeded")
	}
	// Mappings other than the pod's on a mount: refused.
	other := []*criapi.IDMapping{{ContainerId: 0, HostId: 5000, Length: 1000}}
	bad := e.usernsCtrConfig("other-map", "true")
	bad.Mounts = []*criapi.Mount{{ContainerPath: "/vol", HostPath: vol, UidMappings: other, GidMappings: other}}
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: bad, SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	// A container restating other user namespace options: refused.
	bad = e.usernsCtrConfig("other-userns", "true")
	bad.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &criapi.UserNamespace{Mode: criapi.NamespaceMode_NODE}
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: bad, SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)

	running := e.run(withVol(e.usernsCtrConfig("running", "sleep", "3600")))
	e.waitExited(e.run(withVol(e.usernsCtrConfig("exited", "touch", "/vol/x"))))
	if !mountedBelow(t, filepath.Join(e.d.Root, "containers", running, "idmounts")) {
		t.Fatal("running container has no idmapped volume mount")
	}
	stopRemove(t, e.d, e.pod)
	if _, err := os.Stat(strings.TrimSuffix(info.NetNSPath, "-net") + "-user"); !os.IsNotExist(err) {
		t.Fatalf("user namespace pin left: %v", err)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if entries, _ := os.ReadDir(filepath.Join(e.d.Root, "containers")); len(entries) != 0 {
		t.Fatalf("%d container dirs left", len(entries))
	}
}

// A berthd restart keeps a running user namespace pod working: the pin
// and pause holder survive, exec still runs in the namespace, and a new
// container joins the same namespace.
func TestUsernsPodSurvivesRestart(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_POD)
	id := e.run(e.usernsCtrConfig("long", "sleep", "3600"))
	before := execOut(t, e, id, "readlink", "/proc/self/ns/user")
	e.d.Restart()
	st, _ := podStatus(t, e.d, e.pod)
	if st.State != criapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod %s after restart", st.State)
	}
	if got := execOut(t, e, id, "readlink", "/proc/self/ns/user"); got != before {
		t.Fatalf("user namespace %q after restart, was %q", got, before)
	}
	if m := execOut(t, e, id, "cat", "/proc/self/uid_map"); !mapLine.MatchString(strings.TrimSpace(m)) {
		t.Fatalf("uid_map after restart %q", m)
	}
	next := e.run(e.usernsCtrConfig("next", "sleep", "3600"))
	if got := execOut(t, e, next, "readlink", "/proc/self/ns/user"); got != before {
		t.Fatalf("new container's user namespace %q, pod's %q", got, before)
	}
	stopRemove(t, e.d, e.pod)
}

// berthd dying right after a user namespace pod's namespaces were pinned,
// or right after a container's idmapped rootfs was mounted, leaves
// nothing once the kubelet removes what it lists after the restart.
func TestUsernsCrashesLeaveNothing(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_POD)
	vol := filepath.Join(e.d.Dir, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	stopRemove(t, e.d, e.pod)
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	before := leakcheck.Take(t, scope)
	for _, c := range []struct {
		point fault.Point
		op    func(ctx context.Context) error
	}{
		{fault.SandboxAfterNetnsCreate, func(ctx context.Context) error {
			_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: usernsPodConfig("crash-pod", criapi.NamespaceMode_POD)})
			return err
		}},
		{fault.ContainerAfterRuncCreate, func(ctx context.Context) error {
			e.podCfg = usernsPodConfig("crash-ctr", criapi.NamespaceMode_POD)
			e.podCfg.LogDirectory = e.logDir
			pod, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: e.podCfg})
			if err != nil {
				t.Errorf("RunPodSandbox: %v", err)
				return err
			}
			cfg := e.usernsCtrConfig("crash", "sleep", "3600")
			cfg.Mounts = []*criapi.Mount{{ContainerPath: "/vol", HostPath: vol, UidMappings: usernsMapping, GidMappings: usernsMapping}}
			_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: cfg, SandboxConfig: e.podCfg})
			return err
		}},
	} {
		e.d.Kill()
		e.d.SetEnv(fault.EnvVar + "=" + string(c.point))
		e.d.Start()
		e.d.WaitReady()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := c.op(ctx)
		cancel()
		if err == nil {
			t.Fatalf("%s: the operation succeeded", c.point)
		}
		select {
		case <-e.d.Exited():
		case <-time.After(30 * time.Second):
			t.Fatalf("berthd did not die at %s (%v)", c.point, err)
		}
		e.d.SetEnv()
		e.d.Start()
		e.d.WaitReady()
		ctx = berthdtest.Ctx(t)
		cs, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ctr := range cs.Containers {
			if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: ctr.Id}); err != nil {
				t.Fatalf("%s: RemoveContainer: %v", c.point, err)
			}
		}
		ps, err := e.d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps.Items {
			stopRemove(t, e.d, p.Id)
		}
		leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	}
}

// On a node that cannot run user namespace pods (here: --root below a
// directory others cannot search, so the namespace's root could not reach
// its rootfs) no handler offers them and such a pod is refused up front
// with FailedPrecondition naming the reason.
func TestUsernsRefusedWhereUnsupported(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		if err := os.Chmod(filepath.Dir(c.Root), 0o700); err != nil {
			t.Fatal(err)
		}
	}})
	resp, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.RuntimeHandlers {
		if h.GetFeatures().GetUserNamespaces() {
			t.Errorf("handler %q offers user namespaces", h.Name)
		}
	}
	_, err = d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: usernsPodConfig("unsupported", criapi.NamespaceMode_POD)})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "not searchable by others") {
		t.Fatalf("refusal does not say why: %v", err)
	}
	pods, err := d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("refused pod listed: %v, %v", pods, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.State, "netns")); len(entries) != 0 {
		t.Fatalf("namespace pins left: %v", entries)
	}
}

// TestUsernsImageVolumeIsIDMapped: an image volume in a user namespace
// pod has idmapped layers, like the rootfs: what host root owns in the
// image is the container root's, and it stays read-only. The temporary
// idmapped layer copies are gone once the volume is mounted.
func TestUsernsImageVolumeIsIDMapped(t *testing.T) {
	t.Parallel()
	e := newUsernsEnv(t, criapi.NamespaceMode_CONTAINER)
	cfg := e.usernsCtrConfig("imgvol", "sleep", "3600")
	cfg.Mounts = []*criapi.Mount{
		{ContainerPath: "/vol", Readonly: true, Image: &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")}},
	}
	id := e.run(cfg)
	out := execOut(t, e, id, "sh", "-c", "stat -c '%u:%g' /vol/bin/busybox /bin/busybox; touch /vol/x 2>/dev/null || echo read-only")
	if out != "0:0\n0:0\nread-only\n" {
		t.Fatalf("inside: %q", out)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(e.d.Root, "containers", id, "idmap*")); len(leftovers) != 0 {
		t.Fatalf("idmapped layer copies left after mounting: %v", leftovers)
	}
	stopRemove(t, e.d, e.pod)
	if _, err := os.Stat(filepath.Join(e.d.Root, "containers", id)); !os.IsNotExist(err) {
		t.Fatalf("container dir after removal: %v", err)
	}
}

// newUsernsLeakEnv is newUsernsEnv with its first pod gone (the bridge and
// lock files made) and a leak baseline of the daemon, root included: what
// the test leaves is checked against it with leakcheck.CheckSettled.
func newUsernsLeakEnv(t *testing.T, pid criapi.NamespaceMode) (*ctrEnv, leakcheck.Scope, leakcheck.Snapshot) {
	t.Helper()
	e := newUsernsEnv(t, pid)
	stopRemove(t, e.d, e.pod) // warm up: bridge, lock files
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	return e, scope, leakcheck.Take(t, scope)
}
