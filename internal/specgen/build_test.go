package specgen

import (
	"errors"
	"slices"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestBuildAnnotationsAndBasics(t *testing.T) {
	in := testInput(t)
	in.Config.Image.UserSpecifiedImage = "busybox"
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"io.kubernetes.cri.container-type":    "container",
		"io.kubernetes.cri.sandbox-id":        "p1",
		"io.kubernetes.cri.sandbox-name":      "pod",
		"io.kubernetes.cri.sandbox-namespace": "ns",
		"io.kubernetes.cri.sandbox-uid":       "uid1",
		"io.kubernetes.cri.container-name":    "app",
		"io.kubernetes.cri.image-name":        "busybox",
	}
	for k, v := range want {
		if s.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, s.Annotations[k], v)
		}
	}
	if s.Linux.CgroupsPath != "/berth/c1" || s.Hostname != "podhost" || s.Root == nil || s.Root.Path != "" {
		t.Fatalf("spec basics: cgroups %q hostname %q root %+v", s.Linux.CgroupsPath, s.Hostname, s.Root)
	}
}

func TestBuildRequiredInputs(t *testing.T) {
	for name, mutate := range map[string]func(in *Input){
		"no config":         func(in *Input) { in.Config = nil },
		"no sandbox config": func(in *Input) { in.SandboxConfig = nil },
		"no id":             func(in *Input) { in.ContainerID = "" },
	} {
		t.Run(name, func(t *testing.T) {
			in := testInput(t)
			mutate(&in)
			if _, err := Build(in); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want invalid argument", err)
			}
		})
	}
}

func TestBuildReadonlyRootfs(t *testing.T) {
	in := testInput(t)
	sc(&in).ReadonlyRootfs = true
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Root.Readonly {
		t.Fatal("root not read-only")
	}
}

func TestProbeHost(t *testing.T) {
	h, err := ProbeHost()
	if err != nil {
		t.Fatal(err)
	}
	if h.Hostname == "" || h.RlimitHard["RLIMIT_NOFILE"] == 0 || len(h.AllCapabilities) < 38 {
		t.Fatalf("host = %+v", h)
	}
	// Build with a nil Host probes by itself.
	in := testInput(t)
	in.Host = nil
	if _, err := Build(in); err != nil {
		t.Fatal(err)
	}
}

func TestEffectiveCapabilities(t *testing.T) {
	caps, err := effectiveCapabilities("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000001000021\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"CAP_CHOWN", "CAP_KILL", "CAP_SYS_RESOURCE"}; !slices.Equal(caps, want) {
		t.Fatalf("caps = %q, want %q", caps, want)
	}
	if _, err := effectiveCapabilities("Name:\tx\n"); err == nil {
		t.Fatal("no error without CapEff")
	}
	if _, err := effectiveCapabilities("CapEff:\tzz\n"); err == nil {
		t.Fatal("no error for a bad mask")
	}
}
