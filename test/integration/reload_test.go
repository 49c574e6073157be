package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Live configuration reload (SIGHUP, docs/configuration.md#live-reload,
// decision 2300).

// writeHostsFile writes <dir>/<host>/hosts.toml.
func writeHostsFile(t *testing.T, dir, host, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mirrorOnly is a hosts.toml whose upstream is unreachable, so that only
// the mirror (empty: none) can serve a pull.
func mirrorOnly(mirror string) string {
	s := "server = \"http://127.0.0.1:1\"\n"
	if mirror != "" {
		s += fmt.Sprintf("\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", mirror)
	}
	return s
}

func metricsAddr(t *testing.T, d *berthdtest.Daemon) string {
	t.Helper()
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	return st.Info["metricsAddress"]
}

func wantReloadMetrics(t *testing.T, d *berthdtest.Daemon, success, partial, failure float64) {
	t.Helper()
	got := scrapeMetrics(t, metricsAddr(t, d))
	for result, want := range map[string]float64{"success": success, "partial": partial, "failure": failure} {
		key := "berth_config_reloads_total{result=" + result + "}"
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

// A mirror that a reload points registry_config_dir at serves the next
// pull, without a restart; berthd config --running shows the new
// directory and the metric counts the reload.
func TestReloadMirrorAddedServesTheNextPull(t *testing.T) {
	t.Parallel()
	mirror := testimages.StartRegistry(t)
	mirror.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }})
	writeHostsFile(t, d.Config.RegistryConfigDir, "registry.example.invalid", mirrorOnly(""))
	ref := "registry.example.invalid/busybox:latest"
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err == nil {
		t.Fatal("pull without a mirror succeeded")
	}

	withMirror := filepath.Join(d.Dir, "certs-mirror.d")
	writeHostsFile(t, withMirror, "registry.example.invalid", mirrorOnly(mirror.Host))
	last := d.Reconfigure(func(c *config.Config) { c.RegistryConfigDir = withMirror })
	wantResult(t, last, "success")
	if c := lastChanges(t, last)["registry_config_dir"]; c == nil || c["applied"] != true {
		t.Fatalf("registry_config_dir change: %+v", last)
	}
	img := mustImage(t, testimages.Busybox)
	if id := pull(t, d, ref, nil); id != configDigest(t, img) {
		t.Fatalf("pulled %s, want %s", id, configDigest(t, img))
	}

	// In effect: berthd config --running (the admin service) and Status.
	out, err := exec.Command(berthdtest.Binary(t), "config", "--running", "--listen", "unix://"+d.Socket).CombinedOutput()
	if err != nil {
		t.Fatalf("berthd config --running: %v\n%s", err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("registry_config_dir = %q", withMirror),
		"# last reload: success",
		"#   applied registry_config_dir",
		"generation 2",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("berthd config --running lacks %q:\n%s", want, out)
		}
	}
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Info["config"], withMirror) {
		t.Errorf("Status config does not show the reloaded registry_config_dir: %s", st.Info["config"])
	}
	wantReloadMetrics(t, d, 1, 0, 0)
}

// A pull in flight when a reload changes the mirrors finishes on the
// mirror it started with; the next pull uses the new one.
func TestReloadPullInFlightFinishesOnItsConfig(t *testing.T) {
	t.Parallel()
	regA, regB := testimages.StartRegistry(t), testimages.StartRegistry(t)
	regA.PushStandard(t)
	regB.PushStandard(t)
	dirA, dirB := t.TempDir(), t.TempDir()
	writeHostsFile(t, dirA, "registry.example.invalid", mirrorOnly(regA.Host))
	writeHostsFile(t, dirB, "registry.example.invalid", mirrorOnly(regB.Host))
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.RegistryConfigDir = dirA }})

	ld := bottomLayerDigest(t, mustImage(t, testimages.Busybox))
	hold := regA.HoldBlob(t, ld)
	errc := make(chan error, 1)
	go func() {
		_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: "registry.example.invalid/busybox:latest"}})
		errc <- err
	}()
	select {
	case <-hold.Arrived:
	case err := <-errc:
		t.Fatalf("pull ended before reaching the held layer: %v", err)
	}
	wantResult(t, d.Reconfigure(func(c *config.Config) { c.RegistryConfigDir = dirB }), "success")
	hold.Release()
	if err := <-errc; err != nil {
		t.Fatalf("pull in flight across the reload: %v", err)
	}
	if a, b := regA.BlobFetches(ld), regB.BlobFetches(ld); a != 1 || b != 0 {
		t.Fatalf("layer fetched %d times from the old mirror and %d from the new, want 1 and 0", a, b)
	}

	user := mustImage(t, testimages.BusyboxUser)
	pull(t, d, "registry.example.invalid/"+testimages.UserRef, nil)
	cd := configDigest(t, user)
	if a, b := regA.BlobFetches(cd), regB.BlobFetches(cd); a != 0 || b != 1 {
		t.Fatalf("the next pull's config fetched %d times from the old mirror and %d from the new, want 0 and 1", a, b)
	}
}

// A runtime handler added by a reload runs pods and containers at once;
// its removal while a pod uses it is refused and logged, and applies at
// the first reload after the pod is gone.
func TestReloadRuntimeHandlerAddedThenRemovalRefusedWhileInUse(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	e := newCtrEnvOn(t, d)
	base := d.Config.RuntimeHandlers[d.Config.DefaultRuntimeHandler]
	if base.Binary == "" {
		base = config.RuntimeHandler{Binary: d.Config.Runtime}
	}

	podCfg := podConfig("reload-second")
	podCfg.LogDirectory = e.logDir
	podCfg.Linux.CgroupParent = ""
	_, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: "second"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("RunPodSandbox on an unknown handler: %v, want InvalidArgument", err)
	}

	last := d.Reconfigure(func(c *config.Config) {
		if c.RuntimeHandlers == nil {
			c.RuntimeHandlers = map[string]config.RuntimeHandler{}
		}
		c.RuntimeHandlers["second"] = base
	})
	wantResult(t, last, "success")
	if c := lastChanges(t, last)["runtime_handlers.second"]; c == nil || c["applied"] != true {
		t.Fatalf("handler not added: %+v", last)
	}
	if !slices.Contains(handlerNames(t, d), "second") {
		t.Fatalf("Status does not list the added handler: %v", handlerNames(t, d))
	}
	resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: "second"})
	if err != nil {
		t.Fatalf("RunPodSandbox on the added handler: %v", err)
	}
	pod := resp.PodSandboxId
	cfg := e.config("on-second", "sleep", "3600")
	cr, err := d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		t.Fatalf("CreateContainer on the added handler: %v", err)
	}
	if _, err := d.Runtime.StartContainer(berthdtest.Ctx(t), &criapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
		t.Fatalf("StartContainer on the added handler: %v", err)
	}
	if st := e.status(cr.ContainerId); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container on the added handler is %s", st.State)
	}
	// Its runtime state lives under the handler's own --root.
	if _, err := os.Stat(filepath.Join(d.State, "runtime", "second", cr.ContainerId)); err != nil {
		t.Fatalf("container not run by the added handler's runtime: %v", err)
	}

	last = d.Reconfigure(func(c *config.Config) { delete(c.RuntimeHandlers, "second") })
	wantResult(t, last, "partial")
	c := lastChanges(t, last)["runtime_handlers.second"]
	if c == nil || c["applied"] != false || !strings.Contains(c["reason"].(string), "in use") || !strings.Contains(c["reason"].(string), pod[:12]) {
		t.Fatalf("removal of the in-use handler: %+v", last)
	}
	waitUntil(t, "the reload's \"not applied\" log line", func() bool {
		return strings.Contains(d.Logs(), `msg="configuration reload: not applied" component=config key=runtime_handlers.second`)
	})
	if !slices.Contains(handlerNames(t, d), "second") {
		t.Fatal("in-use handler removed from Status")
	}
	// The kept handler still stops and removes what it runs.
	stopRemove(t, d, pod)

	last = d.Reload()
	wantResult(t, last, "success")
	if c := lastChanges(t, last)["runtime_handlers.second"]; c == nil || c["applied"] != true {
		t.Fatalf("removal once unused: %+v", last)
	}
	if slices.Contains(handlerNames(t, d), "second") {
		t.Fatal("removed handler still listed")
	}
	_, err = d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: "second"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("RunPodSandbox on the removed handler: %v, want InvalidArgument", err)
	}
	stopRemove(t, d, e.pod)
}

func handlerNames(t *testing.T, d *berthdtest.Daemon) []string {
	t.Helper()
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, h := range st.GetRuntimeHandlers() {
		names = append(names, h.GetName())
	}
	return names
}

// A file that does not parse or validate is refused whole: berthd keeps
// serving on the configuration in effect, says so in its log, and counts
// the failures.
func TestReloadBadFileKeepsTheConfigInEffect(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }})
	wantResult(t, d.Reconfigure(func(c *config.Config) { c.ImagePullProgressTimeout = config.Duration(42e9) }), "success")
	before := d.RunningConfig()

	good, err := d.Config.TOML()
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][]byte{
		"not TOML":    []byte("log_level = \"info\"\nthis is [not toml\n"),
		"bad value":   []byte(strings.Replace(string(good), `log_level = "debug"`, `log_level = "loud"`, 1)),
		"unknown key": append(append([]byte{}, good...), []byte("\nlog_levle = \"info\"\n")...),
		"bad handler": []byte(string(good) + "\n[runtime_handlers.nobinary]\n  options = []\n"),
	}
	for name, data := range bad {
		if name == "bad value" && string(data) == string(good) {
			t.Fatalf("bad value: log_level not found in the config:\n%s", good)
		}
		last := d.ReloadFile(data)
		wantResult(t, last, "failure")
		if e, _ := last["error"].(string); e == "" {
			t.Errorf("%s: refused without a reason: %+v", name, last)
		}
	}
	// A missing file (being replaced, say) is refused too: at start it
	// would mean the defaults.
	if err := os.Remove(d.ConfigPath); err != nil {
		t.Fatal(err)
	}
	wantResult(t, d.Reload(), "failure")
	refused := len(bad) + 1
	// The log is a pipe: wait for the lines to come through.
	waitUntil(t, "the refused reloads' log lines", func() bool {
		return strings.Count(d.Logs(), `msg="configuration reload refused: the configuration in effect stays"`) == refused
	})
	after := d.RunningConfig()
	if after["generation"] != before["generation"] || after["toml"] != before["toml"] {
		t.Fatalf("a refused file changed the configuration in effect:\nbefore %v\nafter %v", before["toml"], after["toml"])
	}
	if !strings.Contains(after["toml"].(string), `image_pull_progress_timeout = "42s"`) {
		t.Fatalf("configuration in effect lost the applied reload:\n%s", after["toml"])
	}
	// Still serving.
	if _, err := d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{}); err != nil {
		t.Fatalf("Version after refused reloads: %v", err)
	}
	wantReloadMetrics(t, d, 1, 0, float64(refused))

	// A key that needs a restart is kept, logged and counted as partial.
	// (A copy: the test's cleanup needs the cgroup parent berthd uses.)
	moved := *d.Config
	moved.CgroupParent = "elsewhere"
	data, err := moved.TOML()
	if err != nil {
		t.Fatal(err)
	}
	last := d.ReloadFile(data)
	wantResult(t, last, "partial")
	if c := lastChanges(t, last)["cgroup_parent"]; c == nil || c["applied"] != false || !strings.Contains(c["reason"].(string), "restart") {
		t.Fatalf("cgroup_parent change: %+v", last)
	}
	wantReloadMetrics(t, d, 1, 1, float64(refused))
}

// log_level changes at the reload: at info the per-request debug lines
// stop, back at debug they come again.
func TestReloadLogLevel(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{}) // debug
	const versionLine = "method=/runtime.v1.RuntimeService/Version"
	const reloaded = `msg="configuration reloaded"`
	wantResult(t, d.Reconfigure(func(c *config.Config) { c.LogLevel = "info" }), "success")
	for i := 0; i < 3; i++ {
		if _, err := d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	wantResult(t, d.Reconfigure(func(c *config.Config) { c.LogLevel = "debug" }), "success")
	if _, err := d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	// The log is a pipe: wait for the last line to come through; all
	// before it has then.
	var logs string
	waitUntil(t, "the second reload's version line in the log", func() bool {
		logs = d.Logs()
		i := nthIndex(logs, reloaded, 2)
		return i >= 0 && strings.Contains(logs[i:], versionLine)
	})
	first, second := nthIndex(logs, reloaded, 1), nthIndex(logs, reloaded, 2)
	if strings.Contains(logs[first:second], versionLine) {
		t.Fatalf("debug request lines logged at log_level info:\n%s", logs[first:second])
	}
}

// nthIndex is the index of the n-th (from 1) occurrence of sub, or -1.
func nthIndex(s, sub string, n int) int {
	at := -1
	for i := 0; i < n; i++ {
		j := strings.Index(s[at+1:], sub)
		if j < 0 {
			return -1
		}
		at += 1 + j
	}
	return at
}

// image_pull_progress_timeout set by a reload ends the next stalled pull,
// while a pull that started without a timeout, stalled all along, is not
// cancelled and finishes once the registry sends again.
func TestReloadPullProgressTimeoutAppliesToTheNextPull(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.ImagePullProgressTimeout = 0 }})

	ld := bottomLayerDigest(t, mustImage(t, testimages.Busybox))
	holdA := reg.HoldBlob(t, ld)
	errA := make(chan error, 1)
	go func() {
		// No deadline of its own, as the kubelet's.
		_, err := d.Image.PullImage(context.Background(), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.BusyboxRef)}})
		errA <- err
	}()
	select {
	case <-holdA.Arrived:
	case err := <-errA:
		t.Fatalf("pull ended before reaching the held layer: %v", err)
	}

	wantResult(t, d.Reconfigure(func(c *config.Config) { c.ImagePullProgressTimeout = config.Duration(time.Second) }), "success")
	holdB := reg.HoldBlob(t, configDigest(t, mustImage(t, testimages.BusyboxUser)))
	_, err := d.Image.PullImage(context.Background(), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.UserRef)}})
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
	if !strings.Contains(err.Error(), "image_pull_progress_timeout") {
		t.Fatalf("error does not name the setting: %v", err)
	}
	select {
	case <-holdB.Arrived:
	default:
		t.Fatal("the second pull never reached its held blob")
	}
	// The first pull has been silent longer than the new timeout, but it
	// runs on the settings it started with.
	select {
	case err := <-errA:
		t.Fatalf("the pull started without a progress timeout ended: %v", err)
	default:
	}
	holdA.Release()
	if err := <-errA; err != nil {
		t.Fatalf("the pull started without a progress timeout: %v", err)
	}
	holdB.Release()
	pull(t, d, reg.Ref(testimages.UserRef), nil)
}
