package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/kubelettest"
)

// FullNodePods is the kubelet's default maxPods: a full node.
const FullNodePods = 110

// FullNodeKubeletConfig is what the full-node kubelet runs with beyond
// StartKubelet's basics; each line is there so that only pod start and
// removal are measured (BusyNodeConfig: the images are pulled before the
// pods come, and no pull may wait on another).
const FullNodeKubeletConfig = `# The default, said outright: the node is full at 110 pods, and no
# per-core limit (podsPerCore 0) lowers that on a 2-core machine.
maxPods: 110
podsPerCore: 0
` + kubelettest.BusyNodeConfig

// fullNodePod is one pod of the full node: a busybox web server whose
// readiness is an HTTP GET, and in every third pod a second container
// listening on TCP, ready by a TCP probe. Both end on SIGTERM at once (a
// shell trapping it, as a real workload's process does; busybox httpd
// and nc as PID 1 would ignore it and wait out the grace period). Probes
// run every second, so that the probe period is not what is measured;
// they are the kubelet's own (HTTP, TCP), not execs, so 110 pods do not
// load the runtime with probe work on two cores. Small requests make the
// pods Burstable, as most are.
const fullNodePod = `apiVersion: v1
kind: Pod
metadata:
  name: {{NAME}}
  labels: {app: fullnode}
spec:
  terminationGracePeriodSeconds: 10
  containers:
  - name: web
    image: {{HTTPD}}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap 'exit 0' TERM; httpd -f -p 80 -h /www & wait"]
    resources: {requests: {cpu: 5m, memory: 8Mi}, limits: {memory: 64Mi}}
    readinessProbe:
      httpGet: {path: /, port: 80}
      periodSeconds: 1
      timeoutSeconds: 5
`

const fullNodeSidecar = `  - name: sidecar
    image: {{BUSYBOX}}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap 'exit 0' TERM; nc -ll -p 8081 -e /bin/true & wait"]
    resources: {requests: {cpu: 5m, memory: 8Mi}, limits: {memory: 64Mi}}
    readinessProbe:
      tcpSocket: {port: 8081}
      periodSeconds: 1
      timeoutSeconds: 5
`

// FullNodeManifest is static pod i of the full node.
func FullNodeManifest(i int, httpd, busybox string) (name, manifest string) {
	name = fmt.Sprintf("fullnode-%03d", i)
	m := fullNodePod
	if i%3 == 2 {
		m += fullNodeSidecar
	}
	return name, strings.NewReplacer("{{NAME}}", name, "{{HTTPD}}", httpd, "{{BUSYBOX}}", busybox).Replace(m)
}

// OpStat is one kind of CRI call as the kubelet timed it.
type OpStat struct {
	Count  float64 `json:"count"`
	MeanMs float64 `json:"mean_ms"`
}

// FullNodeResult is one runtime's full-node run.
type FullNodeResult struct {
	Runtime string `json:"runtime"`
	Pods    int    `json:"pods"`
	// Containers is the number of app containers (a third of the pods have two).
	Containers int `json:"containers"`
	// AllReadyS: manifests written → every pod Ready in the kubelet's /pods.
	AllReadyS float64 `json:"all_ready_s"`
	// PodReady: manifests written → each pod first seen Ready (polled).
	PodReady Stats `json:"pod_ready"`
	// The kubelet's kubelet_pod_start_duration_seconds (first seen →
	// running), p50/p90 from its buckets. (kubelet_pod_start_sli_duration_seconds
	// is not recorded for static pods: the kubelet skips them.)
	KubeletStartP50S  float64 `json:"kubelet_pod_start_p50_s"`
	KubeletStartP90S  float64 `json:"kubelet_pod_start_p90_s"`
	KubeletStartMeanS float64 `json:"kubelet_pod_start_mean_s"`
	// AllStoppedS: manifests removed → no pod in /pods, no running
	// container and no ready sandbox in the runtime.
	AllStoppedS float64 `json:"all_stopped_s"`
	// AllRemovedS: manifests removed → the runtime lists no sandbox; the
	// kubelet removes stopped sandboxes in its container GC, once a
	// minute, so this is mostly that period. -1: not within the wait.
	AllRemovedS float64 `json:"all_removed_s"`
	// Runtime memory at 110 pods: berthd + keeper + monitor, or
	// containerd + its shims (the pause processes not included).
	RuntimePSSKiB    uint64 `json:"runtime_pss_kib"`
	RuntimeProcesses int    `json:"runtime_processes"`
	// PausePSSKiB is berth's berth-pause processes (0 for others).
	PausePSSKiB   uint64 `json:"pause_pss_kib"`
	KubeletPSSKiB uint64 `json:"kubelet_pss_kib"`
	// CPU seconds from manifests written to all Ready (user + system, the
	// reaped children included: runc and the CNI plugins): the runtime's
	// processes as above, and the kubelet's.
	RuntimeCPUS float64 `json:"runtime_cpu_s"`
	KubeletCPUS float64 `json:"kubelet_cpu_s"`
	// RuntimeOps is the kubelet's kubelet_runtime_operations_duration_seconds
	// per operation_type, over the whole run.
	RuntimeOps map[string]OpStat `json:"runtime_ops"`
	// PLEGRelistMeanMs is the kubelet's mean PLEG relist time.
	PLEGRelistMeanMs float64 `json:"pleg_relist_mean_ms"`
	// PodWorkerSyncMeanMs is kubelet_pod_worker_duration_seconds (sync).
	PodWorkerMeanMs float64 `json:"pod_worker_mean_ms"`
}

// runtimeProcs are the runtime's own processes and, for berth, its
// pause processes, of this endpoint only.
func runtimeProcs(ep *Endpoint) (own, pause []int) {
	if d := ep.Daemon; d != nil {
		own = append([]int{d.Pid()}, berthdtest.ShimPids(d.State, "keeper")...)
		own = append(own, berthdtest.ShimPids(d.State, "monitor")...)
		for _, pid := range berthdtest.PidsMentioning(d.State) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "berth-pause" {
				pause = append(pause, pid)
			}
		}
		return own, pause
	}
	return ep.Pids(), nil
}

// FullNode writes pods static pod manifests (FullNodePods: a full node)
// at once into the kubelet's manifest dir (the images already pulled),
// waits for all to be Ready, measures the runtime's memory, removes the
// manifests and waits for the pods to stop and go.
func FullNode(ctx context.Context, tb testing.TB, ep *Endpoint, k *Kubelet, pods int, httpd, busybox string) (FullNodeResult, error) {
	res := FullNodeResult{Runtime: ep.Name, Pods: pods, AllRemovedS: -1}
	names := make([]string, pods)
	want := map[string]int{}
	for i := range names {
		name, m := FullNodeManifest(i, httpd, busybox)
		names[i] = name
		want[k.PodName(name)] = i
		res.Containers++
		if i%3 == 2 {
			res.Containers++
		}
		// Dot files are ignored by the kubelet; the renames below make
		// all of them appear within a few milliseconds.
		if err := os.WriteFile(filepath.Join(k.Manifests, "."+name), []byte(m), 0o644); err != nil {
			return res, err
		}
	}
	own, _ := runtimeProcs(ep)
	runtimeCPU, kubeletCPU := CPUSeconds(own), CPUSeconds([]int{k.Pid()})
	start := time.Now()
	for _, name := range names {
		if err := os.Rename(filepath.Join(k.Manifests, "."+name), filepath.Join(k.Manifests, name+".yaml")); err != nil {
			return res, err
		}
	}
	readyAt := make([]time.Duration, pods)
	ready := 0
	var last []KubeletPod
	for ready < pods {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("%d of %d pods Ready when the time ran out: %s", ready, pods, podSummary(last))
		}
		if k.Exited() {
			return res, fmt.Errorf("kubelet exited with %d of %d pods Ready", ready, pods)
		}
		list, err := k.Pods()
		now := time.Since(start)
		if err == nil {
			last = list
			for i := range list {
				if idx, ok := want[list[i].Metadata.Name]; ok && readyAt[idx] == 0 && list[i].Ready() {
					readyAt[idx] = now
					ready++
				}
			}
		}
		if ready < pods {
			time.Sleep(200 * time.Millisecond)
		}
	}
	allReady := time.Since(start)
	res.AllReadyS = allReady.Seconds()
	res.PodReady = Series{Name: "pod ready", Samples: readyAt}.Summary()

	// The runtime's processes now: containerd's shims came with the pods.
	own, pause := runtimeProcs(ep)
	res.RuntimeCPUS = CPUSeconds(own) - runtimeCPU
	res.KubeletCPUS = CPUSeconds([]int{k.Pid()}) - kubeletCPU
	res.RuntimeProcesses = len(own)
	res.RuntimePSSKiB = PSSKiB(own)
	res.PausePSSKiB = PSSKiB(pause)
	res.KubeletPSSKiB = PSSKiB([]int{k.Pid()})
	text, err := k.Metrics()
	if err != nil {
		return res, fmt.Errorf("kubelet metrics: %w", err)
	}
	h := ParseHistogram(text, "kubelet_pod_start_duration_seconds")
	res.KubeletStartP50S, res.KubeletStartP90S, res.KubeletStartMeanS = h.Quantile(0.5), h.Quantile(0.9), h.Mean()

	start = time.Now()
	for _, name := range names {
		if err := os.Remove(filepath.Join(k.Manifests, name+".yaml")); err != nil {
			return res, err
		}
	}
	stopped := false
	for {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("pods not stopped when the time ran out: %w", err)
		}
		if !stopped {
			ok, err := allStopped(ctx, ep, k, want)
			if err != nil {
				return res, err
			}
			if ok {
				stopped = true
				res.AllStoppedS = time.Since(start).Seconds()
			}
		}
		if stopped {
			left, err := k.Sandboxes(ctx, ep)
			if err != nil {
				return res, err
			}
			if len(left) == 0 {
				res.AllRemovedS = time.Since(start).Seconds()
				break
			}
			// Past two garbage collections, what is left stays: the
			// kubelet's cleanup removes it through CRI.
			if time.Since(start) > 150*time.Second {
				tb.Logf("%s: %d sandboxes left after %s; removed at cleanup", ep.Name, len(left), time.Since(start).Round(time.Second))
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if text, err = k.Metrics(); err != nil {
		return res, fmt.Errorf("kubelet metrics: %w", err)
	}
	res.RuntimeOps = runtimeOps(text)
	res.PLEGRelistMeanMs = ParseHistogram(text, "kubelet_pleg_relist_duration_seconds").Mean() * 1000
	res.PodWorkerMeanMs = ParseHistogram(text, "kubelet_pod_worker_duration_seconds", `operation_type="sync"`).Mean() * 1000
	return res, nil
}

// CPUSeconds sums the user and system time of pids and of their reaped
// children, from /proc/PID/stat (clock ticks of 1/100 s).
func CPUSeconds(pids []int) float64 {
	var ticks uint64
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command (in parentheses, which may hold spaces):
		// utime, stime, cutime and cstime are the 12th to 15th.
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 15 {
			continue
		}
		for _, v := range f[11:15] {
			var n uint64
			fmt.Sscan(v, &n)
			ticks += n
		}
	}
	return float64(ticks) / 100
}

// allStopped says whether the kubelet lists none of the pods and the
// runtime runs none of their containers and has none of their sandboxes
// ready.
func allStopped(ctx context.Context, ep *Endpoint, k *Kubelet, want map[string]int) (bool, error) {
	pods, err := k.Pods()
	if err != nil {
		return false, nil
	}
	for i := range pods {
		if _, ok := want[pods[i].Metadata.Name]; ok {
			return false, nil
		}
	}
	sbs, err := k.Sandboxes(ctx, ep)
	if err != nil {
		return false, err
	}
	for _, s := range sbs {
		if s.State == criapi.PodSandboxState_SANDBOX_READY {
			return false, nil
		}
	}
	ctrs, err := ep.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{
		State: &criapi.ContainerStateValue{State: criapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return false, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range ctrs.Containers {
		if strings.HasSuffix(c.Labels["io.kubernetes.pod.name"], "-"+k.NodeName) {
			return false, nil
		}
	}
	return true, nil
}

var opTypeRE = regexp.MustCompile(`^kubelet_runtime_operations_duration_seconds_count\{operation_type="([a-z_]+)"\}`)

// runtimeOps reads kubelet_runtime_operations_duration_seconds per operation_type.
func runtimeOps(text string) map[string]OpStat {
	ops := map[string]OpStat{}
	for _, line := range strings.Split(text, "\n") {
		if m := opTypeRE.FindStringSubmatch(line); m != nil {
			h := ParseHistogram(text, "kubelet_runtime_operations_duration_seconds", `operation_type="`+m[1]+`"`)
			ops[m[1]] = OpStat{Count: h.Count, MeanMs: h.Mean() * 1000}
		}
	}
	return ops
}

// podSummary counts the pods by phase and readiness.
func podSummary(pods []KubeletPod) string {
	counts := map[string]int{}
	for i := range pods {
		counts[fmt.Sprintf("%s ready=%v", pods[i].Status.Phase, pods[i].Ready())]++
	}
	var parts []string
	for k, v := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// fullNodeOps are the CRI calls the table shows the kubelet's mean of.
var fullNodeOps = []string{"run_podsandbox", "create_container", "start_container", "podsandbox_status", "container_status", "stop_container", "stop_podsandbox", "remove_podsandbox"}

// WriteFullNode prints the full-node table (with berth/reference ratios
// when there are two runtimes) and writes kubelet_fullnode.json to dir.
func WriteFullNode(w io.Writer, dir string, results []FullNodeResult) error {
	var b strings.Builder
	f := func(v float64, format string) string {
		if math.IsNaN(v) || v < 0 {
			return "—"
		}
		return fmt.Sprintf(format, v)
	}
	b.WriteString("\n### kubelet full node\n\n")
	if len(results) > 0 {
		fmt.Fprintf(&b, "%d static pods at once (%d app containers, a readiness probe each), kubelet v1.37.2; times in seconds.\n\n", results[0].Pods, results[0].Containers)
	}
	b.WriteString("| runtime | all Ready s | pod Ready p50 / p90 s | kubelet pod start p50 / p90 s | all stopped s | all removed s | runtime processes | runtime PSS MiB | runtime / kubelet CPU s to all Ready |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f / %.1f | %s / %s | %.1f | %s | %d | %.1f | %.1f / %.1f |\n", r.Runtime, r.AllReadyS,
			r.PodReady.P50ms/1000, r.PodReady.P90ms/1000, f(r.KubeletStartP50S, "%.1f"), f(r.KubeletStartP90S, "%.1f"),
			r.AllStoppedS, f(r.AllRemovedS, "%.1f"), r.RuntimeProcesses, float64(r.RuntimePSSKiB)/1024, r.RuntimeCPUS, r.KubeletCPUS)
	}
	if len(results) == 2 {
		a, c := results[0], results[len(results)-1]
		ratio := func(x, y float64) string {
			if x > 0 && y > 0 && !math.IsNaN(x) && !math.IsNaN(y) {
				return fmt.Sprintf("%.2f×", x/y)
			}
			return "—"
		}
		fmt.Fprintf(&b, "| %s / %s | %s | %s / %s | %s / %s | %s | %s | | %s | %s / %s |\n", a.Runtime, c.Runtime,
			ratio(a.AllReadyS, c.AllReadyS), ratio(a.PodReady.P50ms, c.PodReady.P50ms), ratio(a.PodReady.P90ms, c.PodReady.P90ms),
			ratio(a.KubeletStartP50S, c.KubeletStartP50S), ratio(a.KubeletStartP90S, c.KubeletStartP90S),
			ratio(a.AllStoppedS, c.AllStoppedS), ratio(a.AllRemovedS, c.AllRemovedS), ratio(float64(a.RuntimePSSKiB), float64(c.RuntimePSSKiB)),
			ratio(a.RuntimeCPUS, c.RuntimeCPUS), ratio(a.KubeletCPUS, c.KubeletCPUS))
	}
	b.WriteString("\nThe kubelet's mean time per CRI call over the run (ms; kubelet_runtime_operations_duration_seconds) and per PLEG relist:\n\n| runtime |")
	for _, op := range fullNodeOps {
		fmt.Fprintf(&b, " %s |", op)
	}
	b.WriteString(" PLEG relist |\n|---|")
	for range len(fullNodeOps) + 1 {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s |", r.Runtime)
		for _, op := range fullNodeOps {
			if s, ok := r.RuntimeOps[op]; ok {
				fmt.Fprintf(&b, " %.0f |", s.MeanMs)
			} else {
				b.WriteString(" — |")
			}
		}
		fmt.Fprintf(&b, " %s |\n", f(r.PLEGRelistMeanMs, "%.0f"))
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if dir == "" {
		return nil
	}
	// NaN (an empty kubelet histogram) has no JSON form.
	clean := make([]FullNodeResult, len(results))
	for i, r := range results {
		for _, p := range []*float64{&r.KubeletStartP50S, &r.KubeletStartP90S, &r.KubeletStartMeanS, &r.PLEGRelistMeanMs, &r.PodWorkerMeanMs} {
			if math.IsNaN(*p) {
				*p = -1
			}
		}
		ops := map[string]OpStat{}
		for k, v := range r.RuntimeOps {
			if math.IsNaN(v.MeanMs) {
				v.MeanMs = -1
			}
			ops[k] = v
		}
		r.RuntimeOps = ops
		clean[i] = r
	}
	data, err := json.MarshalIndent(map[string]any{"benchmark": "kubelet full node", "results": clean, "time": time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "kubelet_fullnode.json"), data, 0o644)
}
