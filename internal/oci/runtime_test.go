package oci_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

func TestRuncLifecycleUpdateExecAndErrors(t *testing.T) {
	berthdtest.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc not installed")
	}
	dir, err := os.MkdirTemp("", "berth-ocitest-")
	if err != nil {
		t.Fatal(err)
	}
	cgroup := "berthocitest-" + filepath.Base(dir)
	t.Cleanup(func() { _ = berthdtest.CleanupNode(dir, cgroup) })
	rootfs := filepath.Join(dir, "rootfs")
	bundletest.WriteRootfs(t, rootfs)
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := bundletest.Spec(rootfs, cgroup, "c1", []string{"sleep", "1000"})
	spec.Root.Readonly = true
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt := oci.New("runc", filepath.Join(dir, "runtime", "runc"), nil)

	if err := rt.CLI().Create(ctx, "c1", ocicli.CreateOpts{Bundle: bundle, PidFile: filepath.Join(bundle, "pid")}); err != nil {
		t.Fatal(err)
	}
	st, err := rt.State(ctx, "c1")
	if err != nil || st.Status != "created" || st.Pid <= 0 {
		t.Fatalf("state after create: %+v %v", st, err)
	}
	if err := rt.CLI().Start(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if st, _ = rt.State(ctx, "c1"); st.Status != "running" {
		t.Fatalf("state after start: %+v", st)
	}
	// Update: the memory limit lands in the cgroup.
	limit := int64(96 << 20)
	if err := rt.Update(ctx, "c1", &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cgroup, "c1", "memory.limit_in_bytes"))
	if strings.TrimSpace(string(got)) != "100663296" {
		t.Fatalf("memory.limit_in_bytes = %q", got)
	}
	// Exec reuses the container's process settings.
	out, err := os.CreateTemp(dir, "exec-out")
	if err != nil {
		t.Fatal(err)
	}
	proc := *spec.Process
	proc.Args = []string{"sh", "-c", "echo in-container; hostname"}
	if err := rt.Exec(ctx, "c1", &proc, oci.ExecOpts{Stdout: out}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(out.Name()); string(data) != "in-container\nbundletest\n" {
		t.Fatalf("exec output %q", data)
	}
	// Errors carry the runtime's own message; unknown IDs are NotFound.
	err = rt.CLI().Start(ctx, "nope")
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("start unknown: %v", err)
	}
	err = rt.CLI().Create(ctx, "c1", ocicli.CreateOpts{Bundle: bundle})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("create twice: %v", err)
	}
	if err := rt.CLI().Kill(ctx, "c1", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, _ = rt.State(ctx, "c1"); st.Status == "stopped" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s after SIGKILL", st.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := rt.Delete(ctx, "c1", false); err != nil {
		t.Fatal(err)
	}
	// Deleting what the runtime does not know is fine.
	if err := rt.Delete(ctx, "c1", true); err != nil {
		t.Fatalf("delete twice: %v", err)
	}
}
