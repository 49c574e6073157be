package integration

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

func TestMetricsEndpointScrapesAndCountsRequests(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }})
	ctx := ctxT(t)
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
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	found := false
	for _, m := range families["berth_cri_request_duration_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "method" && strings.HasSuffix(l.GetValue(), "/Version") && m.GetHistogram().GetSampleCount() >= 3 {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no Version latency histogram with ≥3 samples in %v", families["berth_cri_request_duration_seconds"])
	}
	errs := families["berth_cri_request_errors_total"].GetMetric()
	if len(errs) == 0 {
		t.Fatal("failed request not counted")
	}
	if _, ok := families["go_goroutines"]; !ok {
		t.Fatal("Go runtime metrics missing")
	}
}

func TestStreamingServerListensOnARealPort(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	st, err := d.Runtime.Status(ctxT(t), &criapi.StatusRequest{Verbose: true})
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
