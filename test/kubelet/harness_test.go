package kubelet

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	corev1 "k8s.io/api/core/v1"

	"github.com/berthcri/berth/internal/testutil/kubelettest"
)

// k8sBins returns the directory holding the Kubernetes programs named
// (kubelettest.BinDir: built by hack/k8s-bins.sh, or $BERTH_K8S_BIN_DIR).
func k8sBins(t *testing.T, progs ...string) string {
	t.Helper()
	return kubelettest.BinDir(t, progs...)
}

// kubeletOptions say where a kubelet runs and what it talks to.
type kubeletOptions = kubelettest.Options

// testKubeletConfig is what the tests' kubelet runs with beyond
// kubelettest's basics: quick to see manifests and resync, small log
// files, pulls in parallel, and no image GC or eviction on a test node's
// small disk.
const testKubeletConfig = `fileCheckFrequency: 2s
syncFrequency: 10s
containerLogMaxSize: 1Mi
` + kubelettest.BusyNodeConfig

// kubelet is one standalone kubelet process (no API server: static pods
// from Manifests), with everything it writes private to this test.
type kubelet struct {
	*kubelettest.Kubelet
}

// startKubelet writes the kubelet's config and starts it; it is stopped,
// its pods' processes killed and its cgroups removed when the test ends
// (the test's own teardown checks these went by themselves first).
func startKubelet(t *testing.T, bin string, opts kubeletOptions) *kubelet {
	t.Helper()
	opts.ExtraConfig = testKubeletConfig + opts.ExtraConfig
	opts.Flags = append([]string{"--fail-swap-on=false"}, opts.Flags...)
	return &kubelet{kubelettest.Start(t, bin, opts)}
}

// pods is the kubelet's /pods on the read-only port: static pods with
// the status the kubelet holds for them.
func (k *kubelet) pods() ([]corev1.Pod, error) { return kubelettest.PodList[corev1.Pod](k.Kubelet) }

// Pod is the kubelet's view of static pod name, nil if it has none.
func (k *kubelet) Pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pods, err := k.pods()
	if err != nil {
		t.Fatalf("kubelet /pods: %v", err)
	}
	for i := range pods {
		if pods[i].Name == k.PodName(name) {
			return &pods[i]
		}
	}
	return nil
}

// WaitPod polls the kubelet until cond holds for static pod name.
func (k *kubelet) WaitPod(t *testing.T, name, what string, timeout time.Duration, cond func(p *corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *corev1.Pod
	for {
		pods, err := k.pods()
		if err == nil {
			last = nil
			for i := range pods {
				if pods[i].Name == k.PodName(name) {
					last = &pods[i]
				}
			}
			if last != nil && cond(last) {
				return last
			}
		}
		if k.Exited() {
			t.Fatalf("kubelet exited while waiting for pod %s: %s", name, what)
		}
		if time.Now().After(deadline) {
			st, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("pod %s: not %s after %s (last /pods error: %v); pod:\n%s", name, what, timeout, err, st)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// WaitGone polls until the kubelet no longer lists static pod name.
func (k *kubelet) WaitGone(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for k.Pod(t, name) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still listed %s after its manifest went", name, timeout)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// Run runs a command in a container through the kubelet's /run (the
// kubelet splits cmd at spaces and calls ExecSync); it returns stdout
// and stderr together.
func (k *kubelet) Run(pod, ctr string, cmd ...string) (string, error) {
	u := k.APIURL(fmt.Sprintf("/run/default/%s/%s", k.PodName(pod), ctr), url.Values{"cmd": {strings.Join(cmd, " ")}})
	resp, err := k.Client.Post(u, "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("POST /run %v: %d %s", cmd, resp.StatusCode, body)
	}
	return string(body), nil
}

// MustRun is Run that fails the test on an error.
func (k *kubelet) MustRun(t *testing.T, pod, ctr string, cmd ...string) string {
	t.Helper()
	out, err := k.Run(pod, ctr, cmd...)
	if err != nil {
		t.Fatalf("run %v in %s/%s: %v", cmd, pod, ctr, err)
	}
	return out
}

// Logs reads a container's log through the kubelet's /containerLogs.
func (k *kubelet) Logs(pod, ctr string, query url.Values) (string, error) {
	resp, err := k.Client.Get(k.APIURL(fmt.Sprintf("/containerLogs/default/%s/%s", k.PodName(pod), ctr), query))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /containerLogs: %d %s", resp.StatusCode, body)
	}
	return string(body), nil
}

// Exec runs a command through the kubelet's /exec as kubectl exec does:
// a WebSocket (v4.channel.k8s.io) the kubelet proxies to berth's
// streaming server. It returns stdout, stderr and the status message
// (empty for exit 0).
func (k *kubelet) Exec(ctx context.Context, pod, ctr string, cmd ...string) (stdout, stderr, status string, err error) {
	q := url.Values{"command": cmd, "output": {"1"}, "error": {"1"}}
	u := k.APIURL(fmt.Sprintf("/exec/default/%s/%s", k.PodName(pod), ctr), q)
	u = "wss" + strings.TrimPrefix(u, "https")
	dialer := websocket.Dialer{
		TLSClientConfig:  &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed loopback server
		Subprotocols:     []string{"v4.channel.k8s.io"},
		HandshakeTimeout: 20 * time.Second,
	}
	conn, resp, err := dialer.DialContext(ctx, u, nil)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			err = fmt.Errorf("%w: %d %s", err, resp.StatusCode, body)
		}
		return "", "", "", err
	}
	defer conn.Close()
	var out, errOut, st bytes.Buffer
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) || errors.Is(err, io.EOF) {
				break
			}
			return out.String(), errOut.String(), st.String(), err
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case 1:
			out.Write(msg[1:])
		case 2:
			errOut.Write(msg[1:])
		case 3:
			st.Write(msg[1:])
		}
	}
	return out.String(), errOut.String(), st.String(), nil
}

// Container status helpers.

func ctrStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func terminated(p *corev1.Pod, name string) *corev1.ContainerStateTerminated {
	if s := ctrStatus(p, name); s != nil {
		return s.State.Terminated
	}
	return nil
}

// mountsByNamespace lists, for every mount namespace on the node, the
// mountinfo lines whose mount point lies under dir, with the processes in
// that namespace: which namespace still holds a volume the kubelet could
// not remove, and with what propagation.
func mountsByNamespace(dir string) string {
	type ns struct {
		pids  []string
		lines []string
	}
	byNS := map[string]*ns{}
	var order []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		id, err := os.Readlink(p + "/ns/mnt")
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(p + "/comm")
		pid := filepath.Base(p) + ":" + strings.TrimSpace(string(comm))
		if n, ok := byNS[id]; ok {
			if len(n.pids) < 8 {
				n.pids = append(n.pids, pid)
			}
			continue
		}
		data, err := os.ReadFile(p + "/mountinfo")
		if err != nil {
			continue
		}
		n := &ns{pids: []string{pid}}
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir) {
				n.lines = append(n.lines, l)
			}
		}
		byNS[id] = n
		order = append(order, id)
	}
	var b strings.Builder
	for _, id := range order {
		n := byNS[id]
		if len(n.lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s (%s):\n  %s\n", id, strings.Join(n.pids, " "), strings.Join(n.lines, "\n  "))
	}
	return b.String()
}
