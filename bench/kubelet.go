package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// A compact copy of test/kubelet's harness (a _test package, so not
// importable): one standalone kubelet, static pods only, on any CRI
// endpoint, with everything it writes below one directory.

// KubeletBinDir returns the directory holding the kubelet built by
// hack/k8s-bins.sh (built on first use, then cached), or
// $BERTH_K8S_BIN_DIR when set.
func KubeletBinDir(tb testing.TB) string {
	tb.Helper()
	if dir := os.Getenv("BERTH_K8S_BIN_DIR"); dir != "" {
		return dir
	}
	_, file, _, _ := runtime.Caller(0)
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(filepath.Dir(file), "..", "hack", "k8s-bins.sh"), "kubelet")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("hack/k8s-bins.sh kubelet: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// kubeletPrivateDevicePlugins runs (by sh, in the kubelet's mount
// namespace) before the kubelet: its device manager serves and clears the
// fixed /var/lib/kubelet/device-plugins, which another kubelet on this
// node may use; it gets a tmpfs of its own there.
const kubeletPrivateDevicePlugins = `set -e
d=/var/lib/kubelet/device-plugins
mkdir -p "$d"
mount --make-private "$(findmnt -n -o TARGET --target "$d")"
mount -t tmpfs -o mode=750 berth-bench-kubelet "$d"
exec "$@"`

// Kubelet is one standalone kubelet process on an Endpoint.
type Kubelet struct {
	Dir, Manifests, LogFile string
	NodeName                string
	// CgroupRoot is the kubelet's cgroupRoot (cgroupfs driver), a path
	// below each hierarchy.
	CgroupRoot         string
	Port, ReadOnlyPort int
	client             *http.Client
	cmd                *exec.Cmd
	done               chan struct{}
}

// StartKubelet runs a kubelet on ep with static pods from its own
// manifest dir; config is appended to its KubeletConfiguration. It is
// stopped, the pods it leaves removed through CRI and its cgroups and
// mounts removed when tb ends.
func StartKubelet(tb testing.TB, ep *Endpoint, config string) *Kubelet {
	tb.Helper()
	rc, err := ep.Runtime.RuntimeConfig(context.Background(), &criapi.RuntimeConfigRequest{})
	if err == nil && rc.GetLinux().GetCgroupDriver() == criapi.CgroupDriver_SYSTEMD {
		tb.Skipf("%s uses the systemd cgroup driver; this benchmark runs the kubelet with cgroupfs", ep.Name)
	}
	// (containerd 1.6 has no RuntimeConfig: the kubelet falls back to its
	// own cgroupDriver, cgroupfs, which is what containerd's runc uses.)
	dir, err := os.MkdirTemp("", "bench-kubelet-")
	if err != nil {
		tb.Fatal(err)
	}
	suffix := filepath.Base(dir)[len("bench-kubelet-"):]
	// Three distinct free ports, held together, then freed for the kubelet.
	ports := make([]int, 3)
	var ls []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	k := &Kubelet{
		Dir: dir, Manifests: filepath.Join(dir, "manifests"), LogFile: filepath.Join(dir, "kubelet.log"),
		NodeName: "bench-" + suffix, CgroupRoot: "/benchkl-" + suffix,
		Port: ports[0], ReadOnlyPort: ports[1],
		client: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet's self-signed loopback certificate
		}},
	}
	for _, d := range []string{k.Manifests, filepath.Join(dir, "root"), filepath.Join(dir, "pki"), filepath.Join(dir, "pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() { k.cleanup(tb, ep) })
	// The kubelet requires its cgroupRoot to exist, with cpuset's files filled.
	for _, d := range k.cgroupRootDirs(tb) {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatalf("create the kubelet's cgroup root: %v", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if data, err := os.ReadFile(filepath.Join(filepath.Dir(d), f)); err == nil {
				_ = os.WriteFile(filepath.Join(d, f), data, 0o644)
			}
		}
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %[1]s
address: 127.0.0.1
port: %[2]d
readOnlyPort: %[3]d
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: %[5]s
cgroupsPerQOS: true
failSwapOn: false
# This host is cgroup v1: the kubelet refuses it unless told not to.
failCgroupV1: false
podLogsDir: %[6]s
volumePluginDir: %[7]s
makeIPTablesUtilChains: false
`, k.Manifests, ports[0], ports[1], ports[2], k.CgroupRoot, filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins")) + config
	cfgPath := filepath.Join(dir, "kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	// A mount namespace of its own, but for dir: a shared bind there (a
	// peer group of its own: private, then shared) lets the mounts the
	// kubelet makes below its root dir reach the node's namespace, where
	// the runtime must see them.
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		tb.Fatalf("bind %s: %v", dir, err)
	}
	for _, flag := range []uintptr{unix.MS_PRIVATE, unix.MS_SHARED} {
		if err := unix.Mount("", dir, "", flag, ""); err != nil {
			tb.Fatalf("remount %s: %v", dir, err)
		}
	}
	argv := []string{"unshare", "--mount", "--propagation", "unchanged", "--",
		"/bin/sh", "-c", kubeletPrivateDevicePlugins, "kubelet",
		filepath.Join(KubeletBinDir(tb), "kubelet"),
		"--config=" + cfgPath,
		"--container-runtime-endpoint=" + ep.Socket,
		"--root-dir=" + filepath.Join(dir, "root"),
		"--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=" + k.NodeName,
		"--v=2",
	}
	logFile, err := os.Create(k.LogFile)
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	k.cmd = exec.Command(argv[0], argv[1:]...)
	k.cmd.Stdout, k.cmd.Stderr = logFile, logFile
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		tb.Fatalf("start kubelet: %v", err)
	}
	k.done = make(chan struct{})
	go func() { _ = k.cmd.Wait(); close(k.done) }()
	deadline := time.Now().Add(2 * time.Minute)
	hc := &http.Client{Timeout: 5 * time.Second}
	for {
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[2]))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if _, err = k.Pods(); err == nil {
					return k
				}
			}
		}
		if k.exited() || time.Now().After(deadline) {
			tb.Fatalf("kubelet not serving (%v); log:\n%s", err, k.LogTail(100))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (k *Kubelet) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// Pid is the kubelet's process id.
func (k *Kubelet) Pid() int { return k.cmd.Process.Pid }

// Stop ends the kubelet (SIGTERM, then SIGKILL after 20 s); its pods stay.
func (k *Kubelet) Stop() {
	if k.cmd == nil || k.cmd.Process == nil || k.exited() {
		return
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(20 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
}

// cleanup stops the kubelet, removes through CRI the pods it left (its
// garbage collection may not have come round yet), then its cgroups and
// mounts, and its directory.
func (k *Kubelet) cleanup(tb testing.TB, ep *Endpoint) {
	if tb.Failed() {
		tb.Logf("kubelet log (end of %s):\n%s", k.LogFile, k.LogTail(200))
	}
	k.Stop()
	if out := os.Getenv("BENCH_OUT"); out != "" {
		// The kubelet's log, to see where a run's time went.
		if data, err := os.ReadFile(k.LogFile); err == nil {
			_ = os.WriteFile(filepath.Join(out, "kubelet_fullnode."+ep.Name+".log"), data, 0o644)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if list, err := k.Sandboxes(ctx, ep); err == nil {
		for _, s := range list {
			if err := removePod(ctx, ep, s.Id); err != nil {
				tb.Errorf("remove pod %s the kubelet left: %v", s.Id, err)
			}
		}
	}
	for _, d := range k.cgroupRootDirs(tb) {
		if _, err := os.Stat(d); err == nil {
			if err := berthdtest.RemoveCgroupTree(d); err != nil {
				tb.Errorf("remove the kubelet's cgroups: %v", err)
			}
		}
	}
	if err := berthdtest.UnmountBelow(k.Dir); err != nil {
		tb.Errorf("unmount below the kubelet's dir: %v", err)
	}
	if err := os.RemoveAll(k.Dir); err != nil {
		tb.Errorf("remove the kubelet's dir: %v", err)
	}
}

// Sandboxes lists the runtime's sandboxes of this kubelet's pods (a
// reference runtime given by BENCH_REF_ENDPOINT may have others).
func (k *Kubelet) Sandboxes(ctx context.Context, ep *Endpoint) ([]*criapi.PodSandbox, error) {
	list, err := ep.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	var out []*criapi.PodSandbox
	for _, s := range list.Items {
		if strings.HasSuffix(s.GetMetadata().GetName(), "-"+k.NodeName) {
			out = append(out, s)
		}
	}
	return out, nil
}

// cgroupRootDirs is the kubelet's cgroup root in every hierarchy.
func (k *Kubelet) cgroupRootDirs(tb testing.TB) []string {
	hs, err := cgroupctrl.Hierarchies("", "")
	if err != nil {
		tb.Fatal(err)
	}
	var dirs []string
	for _, h := range hs {
		dirs = append(dirs, filepath.Join(h.Path, k.CgroupRoot))
	}
	return dirs
}

// LogTail is the end of the kubelet's log.
func (k *Kubelet) LogTail(lines int) string {
	data, _ := os.ReadFile(k.LogFile)
	all := strings.Split(string(data), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// StaticPodName is the name the kubelet gives static pod name.
func (k *Kubelet) StaticPodName(name string) string { return name + "-" + k.NodeName }

// KubeletPod is the part of a pod the benchmark reads from /pods.
type KubeletPod struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Status struct {
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// Ready says whether the pod's Ready condition is True.
func (p *KubeletPod) Ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// Pods is the kubelet's /pods on its read-only port.
func (k *Kubelet) Pods() ([]KubeletPod, error) {
	body, err := k.get(fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort))
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []KubeletPod `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return list.Items, nil
}

// Metrics is the kubelet's /metrics (Prometheus text).
func (k *Kubelet) Metrics() (string, error) {
	body, err := k.get(fmt.Sprintf("https://127.0.0.1:%d/metrics", k.Port))
	return string(body), err
}

func (k *Kubelet) get(url string) ([]byte, error) {
	resp, err := k.client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body, nil
}

// Histogram is one Prometheus histogram series: cumulative counts per
// upper bound (ascending, +Inf last), with its sum and count.
type Histogram struct {
	Bounds     []float64
	Cumulative []float64
	Sum, Count float64
}

// ParseHistogram reads histogram name from Prometheus text, summing the
// series whose labels include all of match (e.g. operation_type="x").
func ParseHistogram(text, name string, match ...string) Histogram {
	byBound := map[float64]float64{}
	var h Histogram
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		series, val := line[:sp], line[sp+1:]
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		metric, labels, _ := strings.Cut(series, "{")
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(labels, m)
		}
		if !ok {
			continue
		}
		switch metric {
		case name + "_sum":
			h.Sum += v
		case name + "_count":
			h.Count += v
		case name + "_bucket":
			_, le, found := strings.Cut(labels, `le="`)
			if !found {
				continue
			}
			le, _, _ = strings.Cut(le, `"`)
			bound, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
			if err != nil {
				continue
			}
			byBound[bound] += v
		}
	}
	for b := range byBound {
		h.Bounds = append(h.Bounds, b)
	}
	sort.Float64s(h.Bounds)
	for _, b := range h.Bounds {
		h.Cumulative = append(h.Cumulative, byBound[b])
	}
	return h
}

// Quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear within the bucket holding it; the highest finite bound
// when it falls in +Inf; NaN for an empty histogram.
func (h Histogram) Quantile(q float64) float64 {
	if len(h.Cumulative) == 0 || h.Cumulative[len(h.Cumulative)-1] == 0 {
		return math.NaN()
	}
	rank := q * h.Cumulative[len(h.Cumulative)-1]
	for i, c := range h.Cumulative {
		if c < rank {
			continue
		}
		if math.IsInf(h.Bounds[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.Bounds[i-1]
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = h.Bounds[i-1], h.Cumulative[i-1]
		}
		if c == below {
			return h.Bounds[i]
		}
		return lo + (h.Bounds[i]-lo)*(rank-below)/(c-below)
	}
	return h.Bounds[len(h.Bounds)-1]
}

// Mean is Sum/Count (NaN when empty).
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	return h.Sum / h.Count
}
