package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// oldCheckpoint is a sandbox as a berthd before decision 2600 wrote it:
// <root>/sandboxes/<id>/checkpoint.json.
const oldCheckpoint = `{
  "version": "v1",
  "id": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
  "config": {"metadata": {"name": "web", "namespace": "ns", "uid": "u1", "attempt": 1}, "hostname": "web-0",
    "linux": {"securityContext": {"namespaceOptions": {"pid": "CONTAINER"}}}},
  "runtimeHandler": "runc",
  "state": "SANDBOX_READY",
  "createdAt": "2026-01-02T03:04:05Z",
  "netnsPath": "/nonexistent/netns/0123-net",
  "pausePid": 0,
  "cgroupParent": "/berth/pod-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
  "hostnamePath": "/r/hostname",
  "hostsPath": "/r/hosts",
  "resolvConfPath": "/r/resolv.conf",
  "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
  "network": {"ips": ["10.88.0.7"]}
}`

const oldID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// A node upgraded in place keeps its pods: the new berthd loads a
// sandbox recorded in checkpoint.json, renames the file sandbox.json, and
// the pod is listed, its name still reserved. A checkpoint.json left
// empty by a power loss is removed as an empty record is.
func TestNewMigratesCheckpointJSON(t *testing.T) {
	tmp := t.TempDir()
	root, state := filepath.Join(tmp, "root"), filepath.Join(tmp, "state")
	dir := filepath.Join(root, "sandboxes", oldID)
	empty := filepath.Join(root, "sandboxes", "empty")
	for _, d := range []string{dir, empty} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.json"), []byte(oldCheckpoint), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(empty, "checkpoint.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := Options{Root: root, State: state, CgroupParent: "berth", RuntimeHandlers: []string{"runc"}, DefaultRuntimeHandler: "runc"}
	for round := range 2 { // the second start finds sandbox.json
		s, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := s.Get(oldID[:8])
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if sb.ID != oldID || sb.Config.GetMetadata().GetName() != "web" || sb.RuntimeHandler != "runc" || sb.IP != "10.88.0.7" ||
			sb.CgroupParent != "/berth/pod-"+oldID || sb.CreatedAt.Year() != 2026 {
			t.Errorf("round %d: loaded %+v", round, sb)
		}
		if sb.State != runtime.PodSandboxState_SANDBOX_NOTREADY {
			t.Errorf("round %d: state %v; its namespaces are gone, want NOTREADY", round, sb.State)
		}
		if n := len(s.List()); n != 1 {
			t.Errorf("round %d: %d sandboxes listed, want 1", round, n)
		}
		if _, err := os.Stat(filepath.Join(dir, "sandbox.json")); err != nil {
			t.Errorf("round %d: record not renamed: %v", round, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "checkpoint.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("round %d: checkpoint.json still there: %v", round, err)
		}
		if _, err := os.Stat(empty); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("round %d: directory with an empty checkpoint.json kept: %v", round, err)
		}
		cfg := &runtime.PodSandboxConfig{
			Metadata: &runtime.PodSandboxMetadata{Name: "web", Namespace: "ns", Uid: "u1", Attempt: 1},
			Linux:    &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{NamespaceOptions: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_CONTAINER}}},
		}
		if _, err := s.Run(t.Context(), cfg, ""); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("round %d: Run of the migrated pod's name: %v, want AlreadyExists", round, err)
		}
	}
}
