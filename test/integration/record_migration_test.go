package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// A node upgraded in place keeps its pods (decision 2600): a sandbox
// recorded by an older berthd in checkpoint.json is loaded by the new one,
// READY with its address, its file renamed sandbox.json, and it stops
// (CNI DEL with the recorded config and port mappings) and goes without
// leaving anything.
func TestSandboxRecordMigratesFromCheckpointJSON(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	scope := leakcheck.ForDaemon(d)
	before := leakcheck.Take(t, scope)
	cfg := podConfig("upgraded")
	cfg.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(30000 + os.Getpid()%10000)}}
	id := runPod(t, d, cfg)
	st, _ := podStatus(t, d, id)

	d.Kill()
	dir := filepath.Join(d.Root, "sandboxes", id)
	if err := os.Rename(filepath.Join(dir, "sandbox.json"), filepath.Join(dir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	d.Start()
	d.WaitReady()

	st2, _ := podStatus(t, d, id)
	if st2.GetState() != criapi.PodSandboxState_SANDBOX_READY || st2.GetNetwork().GetIp() != st.GetNetwork().GetIp() || st2.GetMetadata().GetName() != "upgraded" {
		t.Fatalf("after the upgrade: %+v, before %+v", st2, st)
	}
	if _, err := os.Stat(filepath.Join(dir, "sandbox.json")); err != nil {
		t.Errorf("record not renamed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("checkpoint.json kept: %v", err)
	}
	if !strings.Contains(d.Logs(), "sandbox record renamed") {
		t.Error("berthd did not log the rename")
	}
	// Its name is still reserved.
	_, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: cfg})
	berthdtest.WantCode(t, err, codes.AlreadyExists)
	stopRemove(t, d, id)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
