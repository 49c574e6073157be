package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// KEP-4960: ContainerConfig.stop_signal overrides the image's STOPSIGNAL,
// StopContainer sends it, and ContainerStatus reports the effective one
// (the image's without an override, SIGTERM without either).
func TestStopSignalFromConfigOverridesImage(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	img, err := testimages.Busybox()
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.StopSignal = "SIGQUIT"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	e.reg.Push(t, "busybox-stopsig:latest", img)
	stopsig := e.reg.Ref("busybox-stopsig:latest")
	pull(t, e.d, stopsig, nil)

	// Exits 42 on SIGUSR1 and 43 on SIGQUIT; as PID 1 it ignores SIGTERM,
	// so a wrong signal ends in SIGKILL (137) after the grace period.
	traps := []string{"sh", "-c", "trap 'exit 42' USR1; trap 'exit 43' QUIT; touch /tmp/ready; while true; do sleep 0.1; done"}
	for _, tc := range []struct {
		name     string
		image    string
		override criapi.Signal
		want     criapi.Signal
		exit     int32
	}{
		{"override", stopsig, criapi.Signal_SIGNAL_SIGUSR1, criapi.Signal_SIGNAL_SIGUSR1, 42},
		{"image", stopsig, criapi.Signal_SIGNAL_RUNTIME_DEFAULT, criapi.Signal_SIGNAL_SIGQUIT, 43},
		{"default", e.reg.Ref("busybox:latest"), criapi.Signal_SIGNAL_RUNTIME_DEFAULT, criapi.Signal_SIGNAL_SIGTERM, 137},
	} {
		cfg := e.config("stopsig-"+tc.name, traps...)
		cfg.Image.Image = tc.image
		cfg.StopSignal = tc.override
		id := e.run(cfg)
		if got := e.status(id).StopSignal; got != tc.want {
			t.Fatalf("%s: status stop_signal %v, want %v", tc.name, got, tc.want)
		}
		waitUntil(t, "the container's traps (/tmp/ready)", func() bool {
			r, err := e.d.Runtime.ExecSync(berthdtest.Ctx(t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"test", "-e", "/tmp/ready"}, Timeout: 5})
			return err == nil && r.ExitCode == 0
		})
		if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: id, Timeout: 2}); err != nil {
			t.Fatal(err)
		}
		st := e.status(id)
		if st.ExitCode != tc.exit || st.StopSignal != tc.want {
			t.Fatalf("%s: exit %d stop_signal %v, want %d %v", tc.name, st.ExitCode, st.StopSignal, tc.exit, tc.want)
		}
	}

	bad := e.config("stopsig-bad", "true")
	bad.StopSignal = criapi.Signal(999)
	_, err = e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: bad, SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
}

// RuntimeFeatures says what berth does: mount_options applied,
// user_namespaces_host_network wherever a handler runs user namespace
// pods (TestUsernsHostNetwork runs one).
func TestStatusFeaturesMountOptionsAndUsernsHostNetwork(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	resp, err := e.d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f := resp.GetFeatures()
	userns := false
	for _, h := range resp.GetRuntimeHandlers() {
		userns = userns || h.GetFeatures().GetUserNamespaces()
	}
	if !f.GetMountOptions() || f.GetUserNamespacesHostNetwork() != userns {
		t.Fatalf("features %+v, want mount_options=true user_namespaces_host_network=%v (as the handlers' user_namespaces)", f, userns)
	}

	// mount_options reach the mount: noexec stops a binary, nodev a node.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := e.config("mountopts", "sh", "-c", "/data/hello; echo rc=$?; grep ' /data ' /proc/self/mounts")
	cfg.Mounts = []*criapi.Mount{{ContainerPath: "/data", HostPath: dir, MountOptions: []string{"noexec", "nodev"}}}
	lines, st := e.output(cfg)
	out := strings.Join(lines, "\n")
	if st.ExitCode != 0 || !strings.Contains(out, "rc=126") || !strings.Contains(out, "noexec") || !strings.Contains(out, "nodev") {
		t.Fatalf("exit %d, output:\n%s", st.ExitCode, out)
	}

	if userns {
		return // TestUsernsHostNetwork runs such a pod
	}
	// Where user namespace pods cannot run, one on the host network is
	// refused as every other one: FailedPrecondition, naming why.
	pod := podConfig("userns-hostnet")
	pod.Linux.SecurityContext.NamespaceOptions.Network = criapi.NamespaceMode_NODE
	pod.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &criapi.UserNamespace{
		Mode: criapi.NamespaceMode_POD,
		Uids: []*criapi.IDMapping{{HostId: 1 << 20, ContainerId: 0, Length: 65536}},
		Gids: []*criapi.IDMapping{{HostId: 1 << 20, ContainerId: 0, Length: 65536}},
	}
	_, err = e.d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: pod})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
}

// default_ulimits set every container's rlimits; one above berthd's own
// hard limit is clamped to it when berthd lacks CAP_SYS_RESOURCE (the
// kernel would refuse it), not failed.
func TestDefaultUlimitsSetContainerRlimits(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.DefaultUlimits = []string{"nofile=1024:1048576", "core=1024:2048"}
	}})
	e := newCtrEnvOn(t, d)
	var own unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &own); err != nil {
		t.Fatal(err)
	}
	hard := uint64(1048576)
	if !holdsCapSysResource(t) {
		hard = min(hard, own.Max)
	}
	lines, st := e.output(e.config("ulimits", "sh", "-c", "grep -E 'open files|core file' /proc/self/limits"))
	out := strings.Join(lines, "\n")
	for _, re := range []string{
		`Max core file size\s+1024\s+2048\s`,
		fmt.Sprintf(`Max open files\s+1024\s+%d\s`, hard),
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("exit %d; /proc/self/limits lacks %q:\n%s", st.ExitCode, re, out)
		}
	}
}

// holdsCapSysResource reports whether this process (and so the berthd it
// starts) has CAP_SYS_RESOURCE in its effective set.
func holdsCapSysResource(t *testing.T) bool {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapEff:\s+([0-9a-f]+)$`).FindSubmatch(status)
	if m == nil {
		t.Fatal("no CapEff in /proc/self/status")
	}
	eff, err := strconv.ParseUint(string(m[1]), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return eff&(1<<unix.CAP_SYS_RESOURCE) != 0
}

// On a node without AppArmor (this kernel has none), RuntimeDefault runs
// the container unconfined, as containerd does, and an explicitly named
// localhost profile is refused with an error that says why.
func TestAppArmorOnANodeWithoutIt(t *testing.T) {
	t.Parallel()
	if b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled"); err == nil && strings.HasPrefix(string(b), "Y") {
		t.Skip("AppArmor is enabled on this node")
	}
	e := newCtrEnv(t)
	cfg := e.config("aa-default", "true")
	cfg.Linux.SecurityContext.Apparmor = &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_RuntimeDefault}
	if _, st := e.output(cfg); st.ExitCode != 0 {
		t.Fatalf("runtime/default container: exit %d (%s)", st.ExitCode, st.Message)
	}

	cfg = e.config("aa-localhost", "true")
	cfg.Linux.SecurityContext.Apparmor = &criapi.SecurityProfile{ProfileType: criapi.SecurityProfile_Localhost, LocalhostRef: "localhost/my-profile"}
	_, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	if msg := err.Error(); !strings.Contains(msg, "my-profile") || !strings.Contains(msg, "AppArmor is not enabled") {
		t.Fatalf("error does not say why: %v", err)
	}
}
