package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

func TestMetricsEndpointScrapesAndCountsRequests(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }})
	ctx := berthdtest.Ctx(t)
	for i := 0; i < 3; i++ {
		if _, err := d.Runtime.Version(ctx, &criapi.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// A failing call is counted by method and code.
	d.Runtime.UpdateRuntimeConfig(ctx, &criapi.UpdateRuntimeConfigRequest{
		RuntimeConfig: &criapi.RuntimeConfig{NetworkConfig: &criapi.NetworkConfig{PodCidr: "bogus"}},
	})
	st, err := d.Runtime.Status(ctx, &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := st.Info["metricsAddress"]
	if addr == "" || strings.HasSuffix(addr, ":0") {
		t.Fatalf("status does not report the metrics address: %q", addr)
	}
	got := scrapeMetrics(t, addr)
	if n := got["berth_cri_request_duration_seconds{method=/runtime.v1.RuntimeService/Version}"]; n < 3 {
		t.Fatalf("Version latency histogram has %v samples, want ≥3", n)
	}
	errs := 0
	for key := range got {
		if strings.HasPrefix(key, "berth_cri_request_errors_total{") {
			errs++
		}
	}
	if errs == 0 {
		t.Fatal("failed request not counted")
	}
	if _, ok := got["go_goroutines"]; !ok {
		t.Fatal("Go runtime metrics missing")
	}
}

func TestStreamingServerListensOnARealPort(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := st.Info["streamingAddress"]
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("streaming address %q", addr)
	}
	// An unknown token is a 404, from the streaming server itself.
	resp, err := http.Get("http://" + addr + "/exec/nonexistent")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown exec token: HTTP %d, want 404", resp.StatusCode)
	}
}

// A container whose CRI log sits on a full disk: berthd reports the records
// the node's monitor could not write, in verbose ContainerStatus and as a
// metric, so a full disk does not go unnoticed; a healthy container reports
// none.
func TestContainerLogOnFullDiskIsReported(t *testing.T) {
	t.Parallel()
	e := newCtrEnvOn(t, berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }}))
	full := filepath.Join(e.logDir, "full")
	if err := os.MkdirAll(full, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", full, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount a tiny tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(full, syscall.MNT_DETACH) })
	cfg := e.config("chatty", "sh", "-c", "seq 1 20000")
	cfg.LogPath = "full/chatty.log"
	chatty := e.run(cfg)
	quiet := e.run(e.config("quiet", "echo", "fine"))
	e.waitExited(chatty)
	e.waitExited(quiet)
	verbose := func(id string) map[string]string {
		resp, err := e.d.Runtime.ContainerStatus(berthdtest.Ctx(t), &criapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Info
	}
	info := verbose(chatty)
	// 20000 records of ~40 bytes, 64 KiB of room: most are lost.
	if n, _ := strconv.Atoi(info["logWriteErrors"]); n < 10000 || info["logWriteError"] != syscall.ENOSPC.Error() {
		t.Fatalf("verbose status: logWriteErrors %q (%q), want most of 20000 (%q)", info["logWriteErrors"], info["logWriteError"], syscall.ENOSPC.Error())
	}
	if info := verbose(quiet); info["logWriteErrors"] != "" {
		t.Fatalf("a healthy container reports log write errors: %v", info)
	}
	st, err := e.d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	got := scrapeMetrics(t, st.Info["metricsAddress"])
	if n := got["berth_container_log_write_errors_total{container="+chatty+"}"]; n < 10000 {
		t.Fatalf("metric for the full disk's container: %v", n)
	}
	if n, ok := got["berth_container_log_write_errors_total{container="+quiet+"}"]; !ok || n != 0 {
		t.Fatalf("metric for the healthy container: %v (present %v)", n, ok)
	}
	stopRemove(t, e.d, e.pod)
}
