package integration

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// badRequest is one CRI call with a missing or invalid field and the code
// it must get.
type badRequest struct {
	name string
	call func(ctx context.Context, e *ctrEnv, pod, ctr string) error
	want codes.Code
}

// badPod is a valid pod config with one thing broken.
func badPod(name string, edit func(*criapi.PodSandboxConfig)) func(context.Context, *ctrEnv, string, string) error {
	return func(ctx context.Context, e *ctrEnv, _, _ string) error {
		cfg := podConfig("bad-" + name)
		cfg.LogDirectory = e.logDir
		edit(cfg)
		_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
		return err
	}
}

// badCtr is a valid container config in the ready pod with one thing broken.
func badCtr(edit func(*criapi.ContainerConfig)) func(context.Context, *ctrEnv, string, string) error {
	return func(ctx context.Context, e *ctrEnv, pod, _ string) error {
		cfg := e.config("bad", "sleep", "3600")
		edit(cfg)
		_, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: e.podCfg})
		return err
	}
}

func withMount(m *criapi.Mount) func(*criapi.ContainerConfig) {
	return func(c *criapi.ContainerConfig) { c.Mounts = append(c.Mounts, m) }
}

func withDevice(d *criapi.Device) func(*criapi.ContainerConfig) {
	return func(c *criapi.ContainerConfig) { c.Devices = append(c.Devices, d) }
}

const unknownID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

var badRequests = []badRequest{
	// RunPodSandbox
	{"RunPodSandbox/no config", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{})
		return err
	}, codes.InvalidArgument},
	{"RunPodSandbox/no metadata", badPod("nometa", func(c *criapi.PodSandboxConfig) { c.Metadata = nil }), codes.InvalidArgument},
	{"RunPodSandbox/empty name", badPod("noname", func(c *criapi.PodSandboxConfig) { c.Metadata.Name = "" }), codes.InvalidArgument},
	{"RunPodSandbox/empty namespace", badPod("nons", func(c *criapi.PodSandboxConfig) { c.Metadata.Namespace = "" }), codes.InvalidArgument},
	{"RunPodSandbox/empty uid", badPod("nouid", func(c *criapi.PodSandboxConfig) { c.Metadata.Uid = "" }), codes.InvalidArgument},
	{"RunPodSandbox/relative log directory", badPod("rellog", func(c *criapi.PodSandboxConfig) { c.LogDirectory = "var/log/pods/x" }), codes.InvalidArgument},
	{"RunPodSandbox/unclean log directory", badPod("dotlog", func(c *criapi.PodSandboxConfig) { c.LogDirectory = "/var/log/pods/x/../../../etc" }), codes.InvalidArgument},
	{"RunPodSandbox/container port 0", badPod("port0", func(c *criapi.PodSandboxConfig) {
		c.PortMappings = []*criapi.PortMapping{{ContainerPort: 0, HostPort: 18080}}
	}), codes.InvalidArgument},
	{"RunPodSandbox/container port too big", badPod("portbig", func(c *criapi.PodSandboxConfig) {
		c.PortMappings = []*criapi.PortMapping{{ContainerPort: 70000, HostPort: 18080}}
	}), codes.InvalidArgument},
	{"RunPodSandbox/negative host port", badPod("hostneg", func(c *criapi.PodSandboxConfig) {
		c.PortMappings = []*criapi.PortMapping{{ContainerPort: 80, HostPort: -1}}
	}), codes.InvalidArgument},
	{"RunPodSandbox/host port too big", badPod("hostbig", func(c *criapi.PodSandboxConfig) {
		c.PortMappings = []*criapi.PortMapping{{ContainerPort: 80, HostPort: 65536}}
	}), codes.InvalidArgument},
	{"RunPodSandbox/bad host ip", badPod("hostip", func(c *criapi.PodSandboxConfig) {
		c.PortMappings = []*criapi.PortMapping{{ContainerPort: 80, HostPort: 18081, HostIp: "not-an-ip"}}
	}), codes.InvalidArgument},
	{"RunPodSandbox/unknown protocol", badPod("proto", func(c *criapi.PodSandboxConfig) {
		c.PortMappings = []*criapi.PortMapping{{ContainerPort: 80, HostPort: 18082, Protocol: criapi.Protocol(99)}}
	}), codes.InvalidArgument},
	{"RunPodSandbox/unknown runtime handler", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		cfg := podConfig("bad-handler")
		_, err := e.d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "no-such-handler"})
		return err
	}, codes.InvalidArgument},
	{"RunPodSandbox/sysctl not namespaced", badPod("sysctl", func(c *criapi.PodSandboxConfig) {
		c.Linux.Sysctls = map[string]string{"kernel.panic": "1"}
	}), codes.InvalidArgument},
	{"RunPodSandbox/sysctl unknown", badPod("sysctl2", func(c *criapi.PodSandboxConfig) {
		c.Linux.Sysctls = map[string]string{"vm.swappiness": "1"}
	}), codes.InvalidArgument},

	// Sandbox RPCs taking an ID
	{"StopPodSandbox/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{})
		return err
	}, codes.InvalidArgument},
	{"RemovePodSandbox/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{})
		return err
	}, codes.InvalidArgument},
	{"PodSandboxStatus/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{})
		return err
	}, codes.InvalidArgument},
	{"PodSandboxStatus/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: unknownID})
		return err
	}, codes.NotFound},
	{"PodSandboxStats/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.PodSandboxStats(ctx, &criapi.PodSandboxStatsRequest{})
		return err
	}, codes.InvalidArgument},
	{"PodSandboxStats/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.PodSandboxStats(ctx, &criapi.PodSandboxStatsRequest{PodSandboxId: unknownID})
		return err
	}, codes.NotFound},
	{"PortForward/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{Port: []int32{80}})
		return err
	}, codes.InvalidArgument},
	{"PortForward/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{PodSandboxId: unknownID, Port: []int32{80}})
		return err
	}, codes.NotFound},
	{"PortForward/port 0", func(ctx context.Context, e *ctrEnv, pod, _ string) error {
		_, err := e.d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{PodSandboxId: pod, Port: []int32{0}})
		return err
	}, codes.InvalidArgument},
	{"PortForward/port too big", func(ctx context.Context, e *ctrEnv, pod, _ string) error {
		_, err := e.d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{PodSandboxId: pod, Port: []int32{65536}})
		return err
	}, codes.InvalidArgument},

	// CreateContainer
	{"CreateContainer/empty pod id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{Config: e.config("x", "true"), SandboxConfig: e.podCfg})
		return err
	}, codes.InvalidArgument},
	{"CreateContainer/unknown pod", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: unknownID, Config: e.config("x", "true"), SandboxConfig: e.podCfg})
		return err
	}, codes.NotFound},
	{"CreateContainer/no config", func(ctx context.Context, e *ctrEnv, pod, _ string) error {
		_, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: e.podCfg})
		return err
	}, codes.InvalidArgument},
	{"CreateContainer/no metadata", badCtr(func(c *criapi.ContainerConfig) { c.Metadata = nil }), codes.InvalidArgument},
	{"CreateContainer/empty name", badCtr(func(c *criapi.ContainerConfig) { c.Metadata.Name = "" }), codes.InvalidArgument},
	{"CreateContainer/no image", badCtr(func(c *criapi.ContainerConfig) { c.Image = nil }), codes.InvalidArgument},
	{"CreateContainer/image ref does not parse", badCtr(func(c *criapi.ContainerConfig) { c.Image.Image = "Not A//Valid:Ref!" }), codes.InvalidArgument},
	{"CreateContainer/image digest does not parse", badCtr(func(c *criapi.ContainerConfig) { c.Image.Image = "busybox@sha256:xyz" }), codes.InvalidArgument},
	{"CreateContainer/log path ../x", badCtr(func(c *criapi.ContainerConfig) { c.LogPath = "../x" }), codes.InvalidArgument},
	{"CreateContainer/log path a/../../x", badCtr(func(c *criapi.ContainerConfig) { c.LogPath = "a/../../x" }), codes.InvalidArgument},
	{"CreateContainer/absolute log path", badCtr(func(c *criapi.ContainerConfig) { c.LogPath = "/tmp/escape.log" }), codes.InvalidArgument},
	{"CreateContainer/relative mount host path", badCtr(withMount(&criapi.Mount{HostPath: "rel/dir", ContainerPath: "/data"})), codes.InvalidArgument},
	{"CreateContainer/empty mount host path", badCtr(withMount(&criapi.Mount{ContainerPath: "/data"})), codes.InvalidArgument},
	{"CreateContainer/relative mount container path", badCtr(withMount(&criapi.Mount{HostPath: "/tmp", ContainerPath: "data"})), codes.InvalidArgument},
	{"CreateContainer/empty mount container path", badCtr(withMount(&criapi.Mount{HostPath: "/tmp"})), codes.InvalidArgument},
	{"CreateContainer/empty mount", badCtr(withMount(&criapi.Mount{})), codes.InvalidArgument},
	{"CreateContainer/empty device", badCtr(withDevice(&criapi.Device{})), codes.InvalidArgument},
	{"CreateContainer/relative device host path", badCtr(withDevice(&criapi.Device{HostPath: "dev/null", ContainerPath: "/dev/xnull", Permissions: "rwm"})), codes.InvalidArgument},
	{"CreateContainer/relative device container path", badCtr(withDevice(&criapi.Device{HostPath: "/dev/null", ContainerPath: "dev/xnull", Permissions: "rwm"})), codes.InvalidArgument},
	{"CreateContainer/bad device permissions", badCtr(withDevice(&criapi.Device{HostPath: "/dev/null", ContainerPath: "/dev/xnull", Permissions: "rwx"})), codes.InvalidArgument},
	{"CreateContainer/negative cpu shares", badCtr(func(c *criapi.ContainerConfig) {
		c.Linux.Resources = &criapi.LinuxContainerResources{CpuShares: -2}
	}), codes.InvalidArgument},
	{"CreateContainer/negative memory limit", badCtr(func(c *criapi.ContainerConfig) {
		c.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: -5}
	}), codes.InvalidArgument},
	{"CreateContainer/pid target without id", badCtr(func(c *criapi.ContainerConfig) {
		c.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_TARGET
	}), codes.InvalidArgument},
	{"CreateContainer/pid target unknown", badCtr(func(c *criapi.ContainerConfig) {
		c.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_TARGET
		c.Linux.SecurityContext.NamespaceOptions.TargetId = unknownID
	}), codes.NotFound},

	// Container RPCs taking an ID
	// Stopping an unknown object succeeds (idempotent, as CRI-O).
	{"StopPodSandbox/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: unknownID})
		return err
	}, codes.OK},
	// Stopping an unknown object succeeds (idempotent, as CRI-O).
	{"StopContainer/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: unknownID})
		return err
	}, codes.OK},
	{"Attach/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.Attach(ctx, &criapi.AttachRequest{ContainerId: unknownID, Stdout: true})
		return err
	}, codes.NotFound},
	{"Exec/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: unknownID, Cmd: []string{"true"}, Stdout: true})
		return err
	}, codes.NotFound},
	{"Exec/empty cmd", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: ctr, Stdout: true})
		return err
	}, codes.InvalidArgument},
	{"StartContainer/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{})
		return err
	}, codes.InvalidArgument},
	{"StartContainer/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: unknownID})
		return err
	}, codes.NotFound},
	{"StopContainer/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{})
		return err
	}, codes.InvalidArgument},
	{"StopContainer/negative timeout", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: ctr, Timeout: -1})
		return err
	}, codes.InvalidArgument},
	{"RemoveContainer/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{})
		return err
	}, codes.InvalidArgument},
	{"ContainerStatus/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{})
		return err
	}, codes.InvalidArgument},
	{"ContainerStatus/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: unknownID})
		return err
	}, codes.NotFound},
	{"ContainerStats/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ContainerStats(ctx, &criapi.ContainerStatsRequest{})
		return err
	}, codes.InvalidArgument},
	{"ContainerStats/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ContainerStats(ctx, &criapi.ContainerStatsRequest{ContainerId: unknownID})
		return err
	}, codes.NotFound},
	{"UpdateContainerResources/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{Linux: &criapi.LinuxContainerResources{}})
		return err
	}, codes.InvalidArgument},
	{"UpdateContainerResources/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: unknownID, Linux: &criapi.LinuxContainerResources{}})
		return err
	}, codes.NotFound},
	{"UpdateContainerResources/negative memory", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.UpdateContainerResources(ctx, &criapi.UpdateContainerResourcesRequest{ContainerId: ctr, Linux: &criapi.LinuxContainerResources{MemoryLimitInBytes: -5}})
		return err
	}, codes.InvalidArgument},
	{"ReopenContainerLog/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ReopenContainerLog(ctx, &criapi.ReopenContainerLogRequest{})
		return err
	}, codes.InvalidArgument},
	{"ReopenContainerLog/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ReopenContainerLog(ctx, &criapi.ReopenContainerLogRequest{ContainerId: unknownID})
		return err
	}, codes.NotFound},
	{"ExecSync/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{Cmd: []string{"true"}})
		return err
	}, codes.InvalidArgument},
	{"ExecSync/unknown id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: unknownID, Cmd: []string{"true"}})
		return err
	}, codes.NotFound},
	{"ExecSync/empty cmd", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: ctr})
		return err
	}, codes.InvalidArgument},
	{"ExecSync/negative timeout", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"true"}, Timeout: -1})
		return err
	}, codes.InvalidArgument},
	{"Exec/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.Exec(ctx, &criapi.ExecRequest{Cmd: []string{"true"}, Stdout: true})
		return err
	}, codes.InvalidArgument},
	{"Exec/no streams", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: ctr, Cmd: []string{"true"}})
		return err
	}, codes.InvalidArgument},
	{"Exec/tty with stderr", func(ctx context.Context, e *ctrEnv, _, ctr string) error {
		_, err := e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: ctr, Cmd: []string{"true"}, Tty: true, Stdout: true, Stderr: true})
		return err
	}, codes.InvalidArgument},
	{"Attach/empty id", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Runtime.Attach(ctx, &criapi.AttachRequest{Stdout: true})
		return err
	}, codes.InvalidArgument},

	// Image service
	{"PullImage/no image", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.PullImage(ctx, &criapi.PullImageRequest{})
		return err
	}, codes.InvalidArgument},
	{"PullImage/ref does not parse", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: "Not A//Valid:Ref!"}})
		return err
	}, codes.InvalidArgument},
	{"PullImage/digest does not parse", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: e.reg.Ref("busybox") + "@sha256:xyz"}})
		return err
	}, codes.InvalidArgument},
	{"ImageStatus/no image", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.ImageStatus(ctx, &criapi.ImageStatusRequest{})
		return err
	}, codes.InvalidArgument},
	{"ImageStatus/ref does not parse", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: "Not A//Valid:Ref!"}})
		return err
	}, codes.InvalidArgument},
	{"RemoveImage/no image", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{})
		return err
	}, codes.InvalidArgument},
	{"RemoveImage/ref does not parse", func(ctx context.Context, e *ctrEnv, _, _ string) error {
		_, err := e.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: "Not A//Valid:Ref!"}})
		return err
	}, codes.InvalidArgument},
}

// TestBadInputGetsAClearCodeAndLeavesNothing sends every RPC that takes
// user input a request with a missing or invalid field: each must get
// InvalidArgument (NotFound for an unknown ID; stopping an unknown pod or
// container succeeds), never Unknown, Internal or a dropped connection,
// and leave nothing behind.
func TestBadInputGetsAClearCodeAndLeavesNothing(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctr := e.run(e.config("target", "sleep", "3600"))
	scope := leakcheck.ForDaemon(e.d)
	scope.Root = e.d.Root
	before := leakcheck.Take(t, scope)
	pid := e.d.Pid()
	ctx := berthdtest.Ctx(t)
	for _, c := range badRequests {
		err := c.call(ctx, e, e.pod, ctr)
		if got := status.Code(err); got != c.want {
			t.Errorf("%s: got %s (%v), want %s", c.name, got, err, c.want)
		}
	}
	if e.d.Pid() != pid {
		t.Fatalf("berthd restarted")
	}
	// Nothing new is listed: bad requests made no pod, container or image.
	pods, err := e.d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil || len(pods.Items) != 1 {
		t.Errorf("%d pods listed (%v), want only the test's own", len(pods.GetItems()), err)
	}
	ctrs, err := e.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
	if err != nil || len(ctrs.Containers) != 1 {
		t.Errorf("%d containers listed (%v), want only the test's own", len(ctrs.GetContainers()), err)
	}
	if st := e.status(ctr); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("the target container is %v after the bad requests, want running", st.State)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
