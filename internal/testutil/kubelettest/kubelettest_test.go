package kubelettest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestFreePortsAreDistinct(t *testing.T) {
	ports := FreePorts(t, 3)
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v", ports)
		}
		seen[p] = true
	}
}

// readOnlyPort serves body (with status) as a kubelet's /pods.
func readOnlyPort(t *testing.T, status int, body string) *Kubelet {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pods" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	return &Kubelet{ReadOnlyPort: port, Client: srv.Client(), NodeName: "n1"}
}

func TestPodsDecodesReadiness(t *testing.T) {
	k := readOnlyPort(t, http.StatusOK, `{"kind":"PodList","items":[
		{"metadata":{"name":"web-n1"},"status":{"phase":"Running","conditions":[{"type":"Initialized","status":"True"},{"type":"Ready","status":"True"}]}},
		{"metadata":{"name":"db-n1"},"status":{"phase":"Pending","conditions":[{"type":"Ready","status":"False"}]}},
		{"metadata":{"name":"new-n1"},"status":{"phase":"Pending"}}]}`)
	pods, err := k.Pods()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for i := range pods {
		got[pods[i].Metadata.Name] = pods[i].Ready()
	}
	want := map[string]bool{k.PodName("web"): true, k.PodName("db"): false, k.PodName("new"): false}
	if len(got) != len(want) {
		t.Fatalf("pods %v, want %v", got, want)
	}
	for name, ready := range want {
		if r, ok := got[name]; !ok || r != ready {
			t.Fatalf("pods %v, want %v", got, want)
		}
	}
}

func TestPodsRefusesAnError(t *testing.T) {
	k := readOnlyPort(t, http.StatusServiceUnavailable, "not yet")
	if _, err := k.Pods(); err == nil || !strings.Contains(err.Error(), "503 not yet") {
		t.Fatalf("a 503 from /pods: %v", err)
	}
}
