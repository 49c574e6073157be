package lifecycle

import (
	"errors"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/checkpoint"
	"github.com/berthcri/berth/internal/errdefs"
)

// TestRestoredConfigKeepsTheRequestsIdentity: an archive's process user
// fills only what the request leaves unset; a different uid or gid than
// the request's is refused (issue 34, finding 9).
func TestRestoredConfigKeepsTheRequestsIdentity(t *testing.T) {
	in := &restoreInput{
		config: checkpoint.ContainerConfig{Name: "c", RootfsImageRef: "sha256:abc"},
		spec:   specs.Spec{Process: &specs.Process{Args: []string{"sleep", "1"}, User: specs.User{UID: 0, GID: 0}}},
	}
	withSC := func(sc *runtime.LinuxContainerSecurityContext) *runtime.ContainerConfig {
		return &runtime.ContainerConfig{Metadata: &runtime.ContainerMetadata{Name: "c"}, Linux: &runtime.LinuxContainerConfig{SecurityContext: sc}}
	}
	for _, tc := range []struct {
		name     string
		cfg      *runtime.ContainerConfig
		uid, gid int64
		bad      bool
	}{
		{"unset: the archive's", withSC(nil), 0, 0, false},
		{"same uid", withSC(&runtime.LinuxContainerSecurityContext{RunAsUser: &runtime.Int64Value{Value: 0}}), 0, 0, false},
		{"other uid", withSC(&runtime.LinuxContainerSecurityContext{RunAsUser: &runtime.Int64Value{Value: 1000}}), 0, 0, true},
		{"other gid", withSC(&runtime.LinuxContainerSecurityContext{RunAsGroup: &runtime.Int64Value{Value: 1000}}), 0, 0, true},
	} {
		out, err := restoredConfig(tc.cfg, in)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
			}
			continue
		}
		sc := out.GetLinux().GetSecurityContext()
		if err != nil || sc.GetRunAsUser().GetValue() != tc.uid || sc.GetRunAsGroup().GetValue() != tc.gid {
			t.Errorf("%s: %v, %v", tc.name, sc, err)
		}
	}
	// A user name stays the request's: check compares the uid it resolves to.
	out, err := restoredConfig(withSC(&runtime.LinuxContainerSecurityContext{RunAsUsername: "nobody"}), in)
	if err != nil || out.Linux.SecurityContext.RunAsUsername != "nobody" || out.Linux.SecurityContext.RunAsUser != nil {
		t.Errorf("user name: %v, %v", out.GetLinux().GetSecurityContext(), err)
	}
}
