package cdi

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/cditest"
)

func TestRequestedDevices(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  *runtime.ContainerConfig
		want []string
		err  error
	}{
		{name: "none", cfg: &runtime.ContainerConfig{}},
		{name: "field then annotations, each once", cfg: &runtime.ContainerConfig{
			CDIDevices: []*runtime.CDIDevice{{Name: "berth.test/fake=dev1"}},
			Annotations: map[string]string{
				"cdi.k8s.io/b":   "berth.test/fake=dev1,berth.test/fake=dev0",
				"cdi.k8s.io/a":   "vendor.com/gpu=all",
				"something.else": "not=cdi",
			},
		}, want: []string{"berth.test/fake=dev1", "vendor.com/gpu=all", "berth.test/fake=dev0"}},
		{name: "unqualified field", cfg: &runtime.ContainerConfig{CDIDevices: []*runtime.CDIDevice{{Name: "gpu0"}}}, err: errdefs.ErrInvalidArgument},
		{name: "unqualified annotation", cfg: &runtime.ContainerConfig{Annotations: map[string]string{"cdi.k8s.io/x": "gpu0"}}, err: errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Requested(tc.cfg)
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("%q, want %q", got, tc.want)
			}
		})
	}
}

func TestInjectAppliesEveryEdit(t *testing.T) {
	dir := t.TempDir()
	info, hookLog := filepath.Join(dir, "info"), filepath.Join(dir, "hook.log")
	if err := os.WriteFile(info, []byte("fake"), 0o644); err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(dir, "cdi")
	os.MkdirAll(specDir, 0o755)
	if err := os.WriteFile(filepath.Join(specDir, "fake.json"), []byte(cditest.FakeSpec(info, hookLog)), 0o644); err != nil {
		t.Fatal(err)
	}
	// A broken spec beside it is skipped, not fatal.
	if err := os.WriteFile(filepath.Join(specDir, "broken.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := New([]string{filepath.Join(dir, "missing"), specDir}, nil)
	uid := uint32(1000)
	s := &specs.Spec{Process: &specs.Process{User: specs.User{UID: uid, GID: uid}}, Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
	if err := r.Inject(s, []string{"berth.test/fake=dev0", "berth.test/fake=dev1"}); err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != 2 || s.Linux.Devices[0].Path != "/dev/berth-fake0" || s.Linux.Devices[0].Type != "c" ||
		s.Linux.Devices[0].Major != 1 || s.Linux.Devices[0].Minor != 3 || *s.Linux.Devices[0].UID != uid {
		t.Fatalf("devices %+v", s.Linux.Devices)
	}
	rules := s.Linux.Resources.Devices
	if len(rules) != 2 || !rules[0].Allow || rules[0].Access != "rwm" || rules[1].Access != "rw" {
		t.Fatalf("cgroup rules %+v", rules)
	}
	if !slices.Contains(s.Process.Env, "FAKE_DEVICE0=yes") || !slices.Contains(s.Process.Env, "FAKE_DEVICE1=yes") {
		t.Fatalf("env %q", s.Process.Env)
	}
	if len(s.Mounts) != 1 || s.Mounts[0].Destination != "/run/fake/info" || s.Mounts[0].Source != info {
		t.Fatalf("mounts %+v", s.Mounts)
	}
	// The spec-wide edits once, though two of its devices were injected.
	if s.Hooks == nil || len(s.Hooks.CreateRuntime) != 1 || s.Hooks.CreateRuntime[0].Path != "/bin/sh" {
		t.Fatalf("hooks %+v", s.Hooks)
	}

	err := r.Inject(&specs.Spec{Process: &specs.Process{}}, []string{"berth.test/fake=dev0", "berth.test/fake=nope"})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown device: %v, want NotFound", err)
	}
}
