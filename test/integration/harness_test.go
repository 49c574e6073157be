// Package integration drives a real berthd binary over CRI, with real runc,
// overlayfs, CNI plugins and an in-process registry. Tests need root.
//
// One file per feature holds its tests and the helpers only it (or its
// sibling files, such as userns_*, monitor_*, signature_*) uses. What
// other features use lives in the harness files, by kind: this one
// (waitUntil, the one poller; contexts, gRPC codes, berthd's goroutines,
// metrics and reloads), harness_pods_test.go (pod configs, pods and their
// status and stats, network and user namespaces), harness_containers_test.go
// (ctrEnv: a daemon with images and a pod, and its containers; exec, CRI
// logs, stats, events), harness_images_test.go (pulls, the image store)
// and harness_node_test.go (the berthctl binary, cgroups, a private
// systemd).
package integration

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// waitUntil polls cond until it holds. Its bound is a hang guard, not a
// timing assertion (speed belongs in make bench): past it the test fails
// naming what it waited for and, for a cond that returns an error, the
// last error, so the failure says what was seen.
func waitUntil[C func() bool | func() error](t testing.TB, what string, cond C) {
	t.Helper()
	const bound = 90 * time.Second
	deadline := time.Now().Add(bound)
	for {
		var last error
		switch c := any(cond).(type) {
		case func() bool:
			if c() {
				return
			}
		case func() error:
			if last = c(); last == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			if last != nil {
				t.Fatalf("gave up after %s waiting for %s: %v", bound, what, last)
			}
			t.Fatalf("gave up after %s waiting for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goroutines reads berthd's goroutine count from its own metrics.
func goroutines(t *testing.T, d *berthdtest.Daemon) int {
	t.Helper()
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + st.Info["metricsAddress"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	for _, line := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return int(n)
			}
		}
	}
	t.Fatal("no go_goroutines metric")
	return 0
}

// scrapeMetrics reads berthd's /metrics at addr into name{label=value}... →
// value (a histogram's sample count), failing if it does not parse.
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
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
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// lastChanges maps each key of a reload's changes to whether it applied,
// and its reason.
func lastChanges(t *testing.T, last map[string]any) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	changes, _ := last["changes"].([]any)
	for _, c := range changes {
		m, _ := c.(map[string]any)
		out[m["key"].(string)] = m
	}
	return out
}

// wantResult fails unless a reload's last result is result.
func wantResult(t *testing.T, last map[string]any, result string) {
	t.Helper()
	if last["result"] != result {
		t.Fatalf("reload result %v, want %s: %+v", last["result"], result, last)
	}
}
