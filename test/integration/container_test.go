package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

func TestContainerRunLogsExitCodesAndStatus(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	ok := e.run(e.config("ok", "sh", "-c", "echo out; echo err >&2"))
	bad := e.run(e.config("bad", "sh", "-c", "exit 3"))
	st := e.waitExited(ok)
	if st.ExitCode != 0 || st.Reason != "Completed" || st.StartedAt == 0 || st.FinishedAt < st.StartedAt || st.CreatedAt == 0 {
		t.Fatalf("ok status: %+v", st)
	}
	if st.LogPath != filepath.Join(e.logDir, "ok.log") || st.ImageRef == "" || !strings.Contains(st.Image.Image, "busybox") {
		t.Fatalf("ok status paths/image: log %q image %v ref %q", st.LogPath, st.Image, st.ImageRef)
	}
	recs := readCRILog(t, st.LogPath)
	got := map[string]string{}
	for _, r := range recs {
		if r.tag != "F" {
			t.Errorf("partial record %+v", r)
		}
		got[r.stream] += r.msg
	}
	if got["stdout"] != "out" || got["stderr"] != "err" {
		t.Fatalf("log records %+v", recs)
	}
	st = e.waitExited(bad)
	if st.ExitCode != 3 || st.Reason != "Error" {
		t.Fatalf("bad status: %+v", st)
	}
	// Start on a non-created container.
	_, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: ok})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	// Name reservation.
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: e.config("ok", "true"), SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.AlreadyExists)
	// A log path that escapes the pod's log directory.
	esc := e.config("escape", "true")
	esc.LogPath = "../../etc/evil.log"
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: esc, SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	// Unknown pod.
	_, err = e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: "nope", Config: e.config("x", "true")})
	berthdtest.WantCode(t, err, codes.NotFound)

	// List filters.
	list := func(f *criapi.ContainerFilter) int {
		resp, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Containers)
	}
	if n := list(nil); n != 2 {
		t.Fatalf("list all = %d", n)
	}
	if n := list(&criapi.ContainerFilter{Id: ok[:12]}); n != 1 {
		t.Fatalf("list by id prefix = %d", n)
	}
	if n := list(&criapi.ContainerFilter{PodSandboxId: e.pod, LabelSelector: map[string]string{"name": "bad"}}); n != 1 {
		t.Fatalf("list by pod+label = %d", n)
	}
	if n := list(&criapi.ContainerFilter{State: &criapi.ContainerStateValue{State: criapi.ContainerState_CONTAINER_RUNNING}}); n != 0 {
		t.Fatalf("list running = %d", n)
	}
	// Remove; removing again and stopping a missing ID are fine.
	for _, id := range []string{ok, bad, ok} {
		if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("RemoveContainer: %v", err)
		}
	}
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: ok}); err != nil {
		t.Fatalf("StopContainer missing: %v", err)
	}
	_, err = e.d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: ok})
	berthdtest.WantCode(t, err, codes.NotFound)
	if n := list(nil); n != 0 {
		t.Fatalf("list after remove = %d", n)
	}
	mounts, _ := berthdtest.MountsBelow(filepath.Join(e.d.Root, "containers"))
	if len(mounts) != 0 {
		t.Fatalf("mounts left: %v", mounts)
	}
	stopRemove(t, e.d, e.pod)
}

func TestContainerOOMKilled(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("oom", "sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 16 << 20}
	st := e.waitExited(e.run(cfg))
	if st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Fatalf("status: reason %q exit %d", st.Reason, st.ExitCode)
	}
}

// TestContainerOOMKilledAtOnce is killed by one allocation past its limit
// (the kubelet test's oomKilled container): no memory event comes early
// enough for the shim to read the kill from a systemd scope that is gone
// by the time it looks (the guest lane's systemd pass).
func TestContainerOOMKilledAtOnce(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("oom-at-once", "dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 32 << 20}
	st := e.waitExited(e.run(cfg))
	if st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Fatalf("status: reason %q exit %d", st.Reason, st.ExitCode)
	}
}

func TestContainerRunAsUsers(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t, "busybox:latest", "busybox-user:latest")
	// RunAsUser + RunAsGroup from the config.
	cfg := e.config("uidgid", "id")
	cfg.Linux.SecurityContext.RunAsUser = &criapi.Int64Value{Value: 1234}
	cfg.Linux.SecurityContext.RunAsGroup = &criapi.Int64Value{Value: 5678}
	lines, st := e.output(cfg)
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "uid=1234 gid=5678") {
		t.Fatalf("id: %q", lines)
	}
	if st.User.GetLinux().GetUid() != 1234 || st.User.GetLinux().GetGid() != 5678 {
		t.Fatalf("status user: %+v", st.User)
	}
	// RunAsUsername resolved in the image's /etc/passwd.
	cfg = e.config("byname", "id")
	cfg.Linux.SecurityContext.RunAsUsername = testimages.TestUser
	lines, _ = e.output(cfg)
	want := fmt.Sprintf("uid=%d(%s) gid=%d(%s)", testimages.TestUID, testimages.TestUser, testimages.TestGID, testimages.TestGroup)
	if len(lines) != 1 || !strings.HasPrefix(lines[0], want) {
		t.Fatalf("id by name: %q, want prefix %q", lines, want)
	}
	// The image's USER.
	cfg = e.config("imageuser", "id", "-u")
	cfg.Image.Image = e.reg.Ref("busybox-user:latest")
	lines, _ = e.output(cfg)
	if len(lines) != 1 || lines[0] != strconv.Itoa(testimages.TestUID) {
		t.Fatalf("image user: %q", lines)
	}
}

func TestContainerReadonlyRootfsAndCapabilityDrop(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("ro", "sh", "-c", "touch /x 2>&1; echo rc=$?; grep CapEff /proc/self/status")
	cfg.Linux.SecurityContext.ReadonlyRootfs = true
	cfg.Linux.SecurityContext.Capabilities = &criapi.Capability{DropCapabilities: []string{"ALL"}, AddCapabilities: []string{"CAP_KILL"}}
	lines, _ := e.output(cfg)
	all := strings.Join(lines, "\n")
	if !strings.Contains(all, "Read-only file system") || !strings.Contains(all, "rc=1") {
		t.Fatalf("read-only rootfs: %q", lines)
	}
	// CAP_KILL is bit 5: only it remains.
	if !strings.Contains(all, "CapEff:\t0000000000000020") {
		t.Fatalf("capabilities: %q", lines)
	}
}

func TestContainerVolumeMount(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	host := filepath.Join(e.d.Dir, "vol")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "in"), []byte("from host"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := e.config("vol", "sh", "-c", "cat /data/in; echo; echo from container > /data/out; touch /ro/x 2>/dev/null || echo ro-ok")
	cfg.Mounts = []*criapi.Mount{
		{ContainerPath: "/data", HostPath: host},
		{ContainerPath: "/ro", HostPath: host, Readonly: true},
	}
	lines, st := e.output(cfg)
	if strings.Join(lines, ",") != "from host,ro-ok" {
		t.Fatalf("output %q", lines)
	}
	if data, _ := os.ReadFile(filepath.Join(host, "out")); string(data) != "from container\n" {
		t.Fatalf("host sees %q", data)
	}
	if len(st.Mounts) != 2 || st.Mounts[1].ContainerPath != "/ro" || !st.Mounts[1].Readonly {
		t.Fatalf("status mounts %+v", st.Mounts)
	}
}

func TestContainerStopGracePeriodThenKill(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	// Ignores SIGTERM, so only the SIGKILL after the grace period ends it.
	id := e.run(e.config("stubborn", "sh", "-c", "trap 'echo got TERM' TERM; while true; do sleep 0.1; done"))
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	stopped := make(chan error, 1)
	go func() {
		_, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: 2})
		stopped <- err
	}()
	// While the stop waits out the grace period, list and status answer
	// (the kubelet relists every second) instead of queueing behind it.
	time.Sleep(300 * time.Millisecond)
	list, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{Id: id}})
	if err != nil || len(list.Containers) != 1 {
		t.Fatalf("list during stop: %v %v", list, err)
	}
	if _, err := e.d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id}); err != nil {
		t.Fatalf("status during stop: %v", err)
	}
	select {
	case err := <-stopped:
		t.Fatalf("stop ended (%v) before the grace period did: list/status waited for it", err)
	default:
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	st := e.status(id)
	if took < 2*time.Second || took > 10*time.Second || st.State != criapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 {
		t.Fatalf("stop took %s; status %s exit %d", took, st.State, st.ExitCode)
	}
	if recs := readCRILog(t, st.LogPath); len(recs) == 0 || recs[0].msg != "got TERM" {
		t.Fatalf("SIGTERM not delivered first: %+v", recs)
	}
	// Stopping an exited container is a no-op.
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
		t.Fatal(err)
	}
	// Removing a running container forces it.
	run := e.run(e.config("running", "sleep", "1000"))
	if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: run}); err != nil {
		t.Fatal(err)
	}
	// Stopping the pod stops its containers; removing it removes them.
	other := e.run(e.config("other", "sleep", "1000"))
	stopRemove(t, e.d, e.pod)
	_, err = e.d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: other})
	berthdtest.WantCode(t, err, codes.NotFound)
	if pids := berthdtest.PidsMentioning(filepath.Join(e.d.State, "shims")); len(pids) != 0 {
		t.Fatalf("shim processes left: %v", pids)
	}
}

func TestContainerLongLineAndReopenLog(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	cfg := e.config("long", "sh", "-c", "head -c 40000 /dev/zero | tr '\\0' a; echo; read x; echo after; sleep 1000")
	cfg.Stdin, cfg.StdinOnce = true, true
	id := e.run(cfg)
	logPath := e.status(id).LogPath
	waitUntil(t, "three lines in the log", func() bool { data, _ := os.ReadFile(logPath); return strings.Count(string(data), "\n") >= 3 })
	var tags []string
	total := 0
	for _, r := range readCRILog(t, logPath) {
		tags = append(tags, r.tag)
		total += len(r.msg)
	}
	if strings.Join(tags, "") != "PPF" || total != 40000 {
		t.Fatalf("tags %v, %d bytes", tags, total)
	}
	// Rotate as the kubelet does: rename, then ReopenContainerLog.
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.ReopenContainerLog(ctx, &criapi.ReopenContainerLogRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	closeStdin(t, e.d, e.pod, id)
	waitUntil(t, "\"after\" in the reopened log", func() bool { data, _ := os.ReadFile(logPath); return strings.Contains(string(data), "after") })
	if recs := readCRILog(t, logPath); len(recs) != 1 || recs[0].msg != "after" {
		t.Fatalf("new log %+v", recs)
	}
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	_, err := e.d.Runtime.ReopenContainerLog(ctx, &criapi.ReopenContainerLogRequest{ContainerId: id})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
}

func TestContainerUpdateResources(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	cfg := e.config("upd", "sleep", "1000")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, CpuShares: 512}
	id := e.run(cfg)
	upd := &criapi.LinuxContainerResources{MemoryLimitInBytes: 128 << 20, CpuShares: 1024}
	if _, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: upd}); err != nil {
		t.Fatal(err)
	}
	st := e.status(id)
	if st.Resources.GetLinux().GetMemoryLimitInBytes() != 128<<20 || st.Resources.GetLinux().GetCpuShares() != 1024 {
		t.Fatalf("status resources %+v", st.Resources)
	}
	// The cgroup has it.
	pid := containerPid(t, e.d, id)
	if got, err := memoryLimitOf(t, pid); err != nil || got != strconv.Itoa(128<<20) {
		t.Fatalf("memory limit = %q, %v", got, err)
	}
}

func TestContainerSurvivesDaemonCrash(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	counter := e.run(e.config("counter", "sh", "-c", "i=0; while true; do echo $i; i=$((i+1)); usleep 100000; done"))
	short := e.config("short", "sh", "-c", "read x; exit 42")
	short.Stdin, short.StdinOnce = true, true
	shortID := e.run(short)
	time.Sleep(time.Second)

	e.d.Kill()
	// While berthd is down: the counter keeps logging and short exits.
	closeStdin(t, e.d, e.pod, shortID)
	time.Sleep(time.Second)
	e.d.Start()
	e.d.WaitReady()

	st := e.status(counter)
	if st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("counter after restart: %s", st.State)
	}
	st = e.status(shortID)
	if st.State != criapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 42 || st.Reason != "Error" {
		t.Fatalf("short after restart: %s exit %d reason %q", st.State, st.ExitCode, st.Reason)
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: counter}); err != nil {
		t.Fatal(err)
	}
	// The log has every number from 0 up, no gap.
	recs := readCRILog(t, e.status(counter).LogPath)
	if len(recs) < 25 {
		t.Fatalf("only %d lines", len(recs))
	}
	for i, r := range recs {
		if r.msg != strconv.Itoa(i) {
			t.Fatalf("line %d is %q: gap in the log", i, r.msg)
		}
	}
	stopRemove(t, e.d, e.pod)
}

func TestContainerSeccompRuntimeDefaultBlocksUnshare(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	// Creating a user namespace needs no capability from the kernel, but
	// the default seccomp profile refuses unshare(CLONE_NEWUSER).
	run := func(name string, profile *criapi.SecurityProfile) string {
		cfg := e.config(name, "sh", "-c", "busybox unshare -U true 2>/dev/null; echo rc=$?")
		cfg.Linux.SecurityContext.Seccomp = profile
		lines, _ := e.output(cfg)
		return strings.Join(lines, ",")
	}
	if got := run("unconfined", &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_Unconfined}); got != "rc=0" {
		t.Fatalf("unconfined: %q (the kernel refuses user namespaces here?)", got)
	}
	if got := run("default", &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_RuntimeDefault}); got == "rc=0" {
		t.Fatalf("RuntimeDefault allowed unshare(CLONE_NEWUSER): %q", got)
	}
}

func TestContainerVolumePropagationModes(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	// A shared mount of our own, so that every mode is allowed on it.
	host := filepath.Join(e.d.Dir, "shared")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(host, host, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(host, unix.MNT_DETACH) })
	if err := unix.Mount("", host, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	cfg := e.config("prop", "sh", "-c", "read x; grep -E ' /(private|slave|shared) ' /proc/self/mountinfo; ls /slave/late")
	cfg.Stdin, cfg.StdinOnce = true, true
	cfg.Mounts = []*criapi.Mount{
		{ContainerPath: "/private", HostPath: host, Propagation: criapi.MountPropagation_PROPAGATION_PRIVATE},
		{ContainerPath: "/slave", HostPath: host, Propagation: criapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
		{ContainerPath: "/shared", HostPath: host, Propagation: criapi.MountPropagation_PROPAGATION_BIDIRECTIONAL},
	}
	id := e.run(cfg)
	// A mount made on the host after start reaches rslave and rshared
	// mounts, not the private one.
	late := filepath.Join(host, "late")
	if err := os.MkdirAll(late, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", late, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(late, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(late, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	closeStdin(t, e.d, e.pod, id)
	st := e.waitExited(id)
	tags := map[string]string{}
	var files []string
	for _, r := range readCRILog(t, st.LogPath) {
		f := strings.Fields(r.msg)
		if len(f) > 6 && strings.HasPrefix(f[4], "/") {
			tags[f[4]] = strings.Join(f[6:], " ")
		} else {
			files = append(files, r.msg)
		}
	}
	if strings.Contains(tags["/private"], "shared:") || strings.Contains(tags["/private"], "master:") {
		t.Errorf("/private propagates: %q", tags["/private"])
	}
	if !strings.Contains(tags["/slave"], "master:") {
		t.Errorf("/slave is not a slave: %q", tags["/slave"])
	}
	if !strings.Contains(tags["/shared"], "shared:") {
		t.Errorf("/shared is not shared: %q", tags["/shared"])
	}
	if strings.Join(files, ",") != "marker" {
		t.Errorf("host mount after start not seen through /slave: %q", files)
	}
}

func TestContainerSecondRuntimeHandler(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.RuntimeHandlers = map[string]config.RuntimeHandler{"runc": {Binary: "runc"}, "runc2": {Binary: "/usr/sbin/runc"}}
	}})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	pull(t, d, reg.Ref("busybox:latest"), nil)
	e := &ctrEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	e.podCfg = podConfig("handler2")
	e.podCfg.LogDirectory = e.logDir
	resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: e.podCfg, RuntimeHandler: "runc2"})
	if err != nil {
		t.Fatal(err)
	}
	e.pod = resp.PodSandboxId
	id := e.run(e.config("c", "sleep", "1000"))
	// The container lives in runc2's own --root.
	if _, err := os.Stat(filepath.Join(d.State, "runtime", "runc2", id)); err != nil {
		t.Fatalf("runc2 state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.State, "runtime", "runc", id)); !os.IsNotExist(err) {
		t.Fatalf("container in the default handler's root: %v", err)
	}
	_, err = d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig("nohandler"), RuntimeHandler: "nope"})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	stopRemove(t, d, e.pod)
}

func TestContainerEvents(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx, cancel := context.WithCancel(berthdtest.Ctx(t))
	defer cancel()
	stream, err := e.d.Runtime.GetContainerEvents(ctx, &criapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // subscribed before the first event
	id := e.run(e.config("ev", "sh", "-c", "exit 2"))
	e.waitExited(id)
	if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	want := []criapi.ContainerEventType{
		criapi.ContainerEventType_CONTAINER_CREATED_EVENT,
		criapi.ContainerEventType_CONTAINER_STARTED_EVENT,
		criapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		criapi.ContainerEventType_CONTAINER_DELETED_EVENT,
	}
	for _, w := range want {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.ContainerId != id || ev.ContainerEventType != w {
			t.Fatalf("event %s for %s, want %s", ev.ContainerEventType, ev.ContainerId, w)
		}
		if w == criapi.ContainerEventType_CONTAINER_STOPPED_EVENT && ev.ContainersStatuses[0].ExitCode != 2 {
			t.Fatalf("stopped event status %+v", ev.ContainersStatuses[0])
		}
	}
}

// Cycles of pods with containers — created, running, exited, and creates
// failing at each step (unknown image, a spec specgen refuses, a command
// runc cannot exec) — leave nothing behind: no mounts, processes, cgroups,
// files, records or image leases.
func TestContainerLifecycleLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	scope := leakcheck.ForDaemon(e.d)
	stopRemove(t, e.d, e.pod) // warm up: bridge, lock files
	before := leakcheck.Take(t, scope)
	for i := 0; i < 6; i++ {
		e.podCfg = podConfig(fmt.Sprintf("leak-%d", i))
		e.podCfg.LogDirectory = e.logDir
		e.pod = runPod(t, e.d, e.podCfg)
		if i == 0 {
			// A create that fails in a pod with no container yet: the shim
			// started for it meanwhile must not stay behind.
			bad := e.config("first-bad", "true")
			bad.Linux.SecurityContext.RunAsGroup = &criapi.Int64Value{Value: 5}
			_, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: bad, SandboxConfig: e.podCfg})
			berthdtest.WantCode(t, err, codes.InvalidArgument)
			shimDir := filepath.Join(e.d.State, "shims", e.pod)
			deadline := time.Now().Add(5 * time.Second)
			for len(berthdtest.PidsMentioning(shimDir)) != 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if pids := berthdtest.PidsMentioning(shimDir); len(pids) != 0 {
				t.Fatalf("shim left running after the pod's first create failed: %v", pids)
			}
		}
		e.create(e.config("created", "true"))
		e.run(e.config("running", "sleep", "1000"))
		e.waitExited(e.run(e.config("exited", "true")))
		for _, bad := range []*criapi.ContainerConfig{
			func() *criapi.ContainerConfig {
				c := e.config("noimage", "true")
				c.Image.Image = e.reg.Ref("no-such-image:latest")
				return c
			}(),
			func() *criapi.ContainerConfig {
				c := e.config("badspec", "true")
				c.Linux.SecurityContext.RunAsGroup = &criapi.Int64Value{Value: 5}
				return c
			}(),
			e.config("noexec", "/no/such/binary"),
		} {
			if _, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: bad, SandboxConfig: e.podCfg}); err == nil {
				t.Fatalf("cycle %d: create %s succeeded", i, bad.Metadata.Name)
			}
		}
		if i%2 == 0 {
			// Containers removed one by one, the running one forced.
			resp, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{PodSandboxId: e.pod}})
			if err != nil || len(resp.Containers) != 3 {
				t.Fatalf("cycle %d: list %d containers, %v", i, len(resp.Containers), err)
			}
			for _, c := range resp.Containers {
				if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
					t.Fatal(err)
				}
			}
		}
		stopRemove(t, e.d, e.pod)
	}
	// Settled: the unreferenced-chain probe is node-wide and can catch
	// another daemon mid-ADD.
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if entries, _ := os.ReadDir(filepath.Join(e.d.Root, "containers")); len(entries) != 0 {
		t.Fatalf("%d container dirs left", len(entries))
	}
	// No lease keeps the image: it can go, layers and all.
	if _, err := e.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")}}); err != nil {
		t.Fatal(err)
	}
}
