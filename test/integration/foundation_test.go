package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

func TestVersionReportsBerthAndCRIv1(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	v, err := d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{Version: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if v.RuntimeName != "berth" || v.RuntimeApiVersion != "v1" || v.RuntimeVersion == "" {
		t.Fatalf("unexpected version %+v", v)
	}
	// The kubelet parses it so; a failure shows as "berth://Unknown".
	if _, err := utilversion.ParseSemantic(v.RuntimeVersion); err != nil {
		t.Fatalf("runtime_version %q is not a semantic version: %v", v.RuntimeVersion, err)
	}
}

func TestStatusReportsConditionsAndVerboseConfig(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	conds := map[string]*criapi.RuntimeCondition{}
	for _, c := range st.Status.Conditions {
		conds[c.Type] = c
	}
	if c := conds[criapi.RuntimeReady]; c == nil || !c.Status {
		t.Fatalf("RuntimeReady condition: %+v", c)
	}
	if c := conds[criapi.NetworkReady]; c == nil || (!c.Status && (c.Reason == "" || c.Message == "")) {
		t.Fatalf("NetworkReady condition must exist and say why when false: %+v", c)
	}
	var cfg map[string]any
	if err := json.Unmarshal([]byte(st.Info["config"]), &cfg); err != nil {
		t.Fatalf("verbose info config is not JSON: %v (%q)", err, st.Info["config"])
	}
	if cfg["root"] != d.Root {
		t.Fatalf("verbose config root = %v, want %s", cfg["root"], d.Root)
	}
	st, err = d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Info) != 0 {
		t.Fatalf("non-verbose status carries info: %v", st.Info)
	}
}

func TestStatusReportsRuntimeNotReadyWhenBinaryMissing(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Args: []string{"--runtime", "/nonexistent/runc"}})
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Status.Conditions {
		if c.Type == criapi.RuntimeReady {
			if c.Status || c.Reason == "" || !strings.Contains(c.Message, "/nonexistent/runc") {
				t.Fatalf("RuntimeReady with a missing binary: %+v", c)
			}
			return
		}
	}
	t.Fatal("no RuntimeReady condition")
}

// The systemd driver's RuntimeConfig is checked by TestSystemdCgroupDriver,
// which runs berthd under a real systemd (without one berthd refuses to
// start: TestSystemdDriverRefusedWithoutSystemd).
func TestRuntimeConfigReportsCgroupDriver(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Args: []string{"--cgroup-driver", "cgroupfs"}})
	rc, err := d.Runtime.RuntimeConfig(berthdtest.Ctx(t), &criapi.RuntimeConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.GetLinux().GetCgroupDriver(); got != criapi.CgroupDriver_CGROUPFS {
		t.Fatalf("cgroup driver %s, want CGROUPFS", got)
	}
}

func TestUpdateRuntimeConfigStoresPodCIDR(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ctx := berthdtest.Ctx(t)
	_, err := d.Runtime.UpdateRuntimeConfig(ctx, &criapi.UpdateRuntimeConfigRequest{
		RuntimeConfig: &criapi.RuntimeConfig{NetworkConfig: &criapi.NetworkConfig{PodCidr: "10.244.1.0/24"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Runtime.Status(ctx, &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Info["podCIDR"] != "10.244.1.0/24" {
		t.Fatalf("podCIDR in verbose status = %q", st.Info["podCIDR"])
	}
	_, err = d.Runtime.UpdateRuntimeConfig(ctx, &criapi.UpdateRuntimeConfigRequest{
		RuntimeConfig: &criapi.RuntimeConfig{NetworkConfig: &criapi.NetworkConfig{PodCidr: "not-a-cidr"}},
	})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
}

func TestSocketIsCreatedWithMode0660(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	fi, err := os.Stat(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v, want socket 0660", fi.Mode())
	}
}

func TestSocketParentDirectoryIsCreated(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "berth-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "a", "b", "berth.sock")
	berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.Listen = "unix://" + sock }})
	if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s not created: %v", sock, err)
	}
}

func TestSecondDaemonOnSameRootRefusesToStart(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	other := filepath.Join(d.Dir, "other.sock")
	cmd := exec.Command(berthdtest.Binary(t), "--config", d.ConfigPath, "--listen", "unix://"+other)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("second berthd on the same root started; output:\n%s", out)
	}
	if !strings.Contains(string(out), "another berthd") || !strings.Contains(string(out), d.Root) {
		t.Fatalf("second berthd's message does not explain the lock:\n%s", out)
	}
	// The first daemon still serves.
	if _, err := d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{}); err != nil {
		t.Fatalf("first daemon stopped serving: %v", err)
	}
}

func TestSIGTERMExitsZeroAndLeavesStateUntouched(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	// Something the daemon must not tear down on exit: a file in its state
	// dir stands in for running pods until containers exist.
	marker := filepath.Join(d.State, "marker")
	if err := os.WriteFile(marker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("state touched by shutdown: %v", err)
	}
	if _, err := os.Stat(d.Socket); !os.IsNotExist(err) {
		t.Fatalf("socket left after clean shutdown: %v", err)
	}
	// And it starts again on the same root.
	d.Start()
	d.WaitReady()
}

// Every RPC is built: TestEveryCRIRPCIsImplemented (rpc_probe_test.go)
// probes all of them.

func TestSIGTERMLeavesRunningContainersRunning(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	id := e.run(e.config("survivor", "sleep", "3600"))
	pid := containerPid(t, e.d, id)
	e.d.Stop() // SIGTERM; fails the test unless berthd exits 0
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("container process %d gone after berthd's clean shutdown: %v", pid, err)
	}
	e.d.Start()
	e.d.WaitReady()
	if st := e.status(id); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("after restart the container is %s, want running", st.State)
	}
	if got := containerPid(t, e.d, id); got != pid {
		t.Fatalf("container pid changed across the restart: %d → %d", pid, got)
	}
}
