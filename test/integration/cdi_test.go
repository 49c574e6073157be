package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/cditest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// CDI devices, named in CDI_devices or in a cdi.k8s.io annotation, reach
// the container end to end: the device node (a /dev/null-backed fake),
// its env, the spec's mount and its createRuntime hook. An unknown device
// is NotFound, a malformed name InvalidArgument, and neither leaves
// anything behind.
func TestCDIDevicesInjectedEndToEnd(t *testing.T) {
	t.Parallel()
	scratch := t.TempDir()
	specDir := filepath.Join(scratch, "cdi")
	info, hookLog := filepath.Join(scratch, "info"), filepath.Join(scratch, "hook.log")
	if err := os.MkdirAll(specDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(info, []byte("fake-device-info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.CDISpecDirs = []string{filepath.Join(scratch, "static"), specDir}
	}})
	e := newCtrEnvOn(t, d)
	// Written after start, as a DRA driver writes a claim's spec just
	// before the kubelet creates the container.
	if err := os.WriteFile(filepath.Join(specDir, "fake.json"), []byte(cditest.FakeSpec(info, hookLog)), 0o644); err != nil {
		t.Fatal(err)
	}

	script := "echo env0=$FAKE_DEVICE0 env1=$FAKE_DEVICE1; cat /run/fake/info; " +
		"for d in /dev/berth-fake0 /dev/berth-fake1; do test -c $d && echo hi > $d && echo $d ok; done"
	cfg := e.config("cdi-field", "sh", "-c", script)
	cfg.CDIDevices = []*criapi.CDIDevice{{Name: "berth.test/fake=dev0"}}
	cfg.Annotations = map[string]string{"cdi.k8s.io/test": "berth.test/fake=dev1"}
	lines, st := e.output(cfg)
	out := strings.Join(lines, "\n")
	for _, want := range []string{"env0=yes env1=yes", "fake-device-info", "/dev/berth-fake0 ok", "/dev/berth-fake1 ok"} {
		if !strings.Contains(out, want) {
			t.Fatalf("exit %d, output lacks %q:\n%s", st.ExitCode, want, out)
		}
	}
	if got, err := os.ReadFile(hookLog); err != nil || string(got) != "ran\n" {
		t.Fatalf("createRuntime hook log %q, %v; want one run", got, err)
	}

	scope := leakcheck.ForDaemon(e.d)
	before := leakcheck.Take(t, scope)
	for _, tc := range []struct {
		name    string
		devices []string
		annot   map[string]string
		want    codes.Code
	}{
		{"unknown", []string{"berth.test/fake=dev0", "berth.test/fake=missing"}, nil, codes.NotFound},
		{"unknown vendor", nil, map[string]string{"cdi.k8s.io/x": "other.test/gpu=0"}, codes.NotFound},
		{"malformed", []string{"dev0"}, nil, codes.InvalidArgument},
	} {
		cfg := e.config("cdi-"+strings.ReplaceAll(tc.name, " ", "-"), "true")
		for _, n := range tc.devices {
			cfg.CDIDevices = append(cfg.CDIDevices, &criapi.CDIDevice{Name: n})
		}
		cfg.Annotations = tc.annot
		_, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
		berthdtest.WantCode(t, err, tc.want)
		if tc.want == codes.NotFound && !strings.Contains(err.Error(), "missing") && !strings.Contains(err.Error(), "other.test/gpu=0") {
			t.Fatalf("%s: error does not name the device: %v", tc.name, err)
		}
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	if got, _ := os.ReadFile(hookLog); string(got) != "ran\n" {
		t.Fatalf("hook ran for a refused container: %q", got)
	}
}
