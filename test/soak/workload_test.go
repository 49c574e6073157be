package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/kubelettest"
)

// soakPod is one pod of the node, shaped like the kubelet's full-node
// bench (bench/fullnode.go): a busybox web server Ready by an HTTP GET,
// and in every third pod a second container; here the web server also
// has an exec liveness probe, and the second container logs a line of
// ~200 bytes a second (rotated by the kubelet at 256 KiB) and is Ready by
// an exec probe. Both end on SIGTERM at once (a shell trapping it).
const soakPod = `apiVersion: v1
kind: Pod
metadata:
  name: {{NAME}}
  labels: {app: soak}
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
      periodSeconds: 5
      timeoutSeconds: 5
    livenessProbe:
      exec: {command: [cat, /www/index.html]}
      periodSeconds: 60
      timeoutSeconds: 10
      failureThreshold: 3
`

const soakLogger = `  - name: logger
    image: {{BUSYBOX}}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap 'exit 0' TERM; (i=0; while true; do echo {{NAME}} tick $i {{PAD}}; i=$((i+1)); sleep 1; done) & wait"]
    resources: {requests: {cpu: 5m, memory: 8Mi}, limits: {memory: 64Mi}}
    readinessProbe:
      exec: {command: [test, -d, /proc/1]}
      periodSeconds: 20
      timeoutSeconds: 10
`

// hasLogger says whether the pod in slot has the logger container.
func hasLogger(slot int) bool { return slot%3 == 2 }

func manifest(name string, slot int) string {
	m := soakPod
	if hasLogger(slot) {
		m += soakLogger
	}
	return strings.NewReplacer("{{NAME}}", name, "{{HTTPD}}", httpdImage, "{{BUSYBOX}}", busyboxImage,
		"{{PAD}}", strings.Repeat("x", 160)).Replace(m)
}

// podTrack is what the soak knows of one pod (one generation of a slot).
type podTrack struct {
	name       string // the manifest's; the kubelet's is name-<node>
	slot       int
	applied    time.Time
	deleted    time.Time // zero while its manifest is there
	firstReady time.Time
	// notReadySince is when a pod that was Ready stopped being so.
	notReadySince time.Time
	ready         bool
	// startCut: its start was cut (run ended) before it was Ready.
	startCut bool
	restarts map[string]int32
	// ran: the container's previous instance had started (a restart);
	// lastTerm says how it ended.
	ran      map[string]bool
	lastTerm map[string]string
}

// interval is a time a pod was not Ready: from its manifest to its first
// Ready ("start"), or from losing Ready to regaining it ("not-ready");
// cut when its manifest went or the run ended.
type interval struct {
	Pod   string    `json:"pod"`
	Kind  string    `json:"kind"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Cut   bool      `json:"cut,omitempty"`
}

func (i interval) length() time.Duration { return i.End.Sub(i.Start) }

// workload owns the pods: their manifests (churn), their readiness and
// restart counts as the kubelet reports them (polled from /pods).
type workload struct {
	n   *node
	rng *rand.Rand // guarded by mu

	mu        sync.Mutex
	slots     []*podTrack          // the live generation of each slot
	byKubelet map[string]*podTrack // every generation, by the kubelet's name
	gen       []int
	intervals []interval
	created   int
	pollErrs  int
	lastErr   string
}

func newWorkload(n *node, rng *rand.Rand) *workload {
	return &workload{n: n, rng: rng, slots: make([]*podTrack, n.p.Pods), gen: make([]int, n.p.Pods), byKubelet: map[string]*podTrack{}}
}

// writeManifest writes a static pod manifest atomically (the kubelet
// ignores dot files).
func (w *workload) writeManifest(name, data string) error {
	tmp := filepath.Join(w.n.k.Manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(w.n.k.Manifests, name+".yaml"))
}

// apply starts the next generation of slot. Caller holds mu.
func (w *workload) applyLocked(slot int) error {
	w.gen[slot]++
	name := fmt.Sprintf("soak-%03d-g%d", slot, w.gen[slot])
	if err := w.writeManifest(name, manifest(name, slot)); err != nil {
		return fmt.Errorf("apply pod %s: %w", name, err)
	}
	p := &podTrack{name: name, slot: slot, applied: time.Now(), restarts: map[string]int32{}, ran: map[string]bool{}, lastTerm: map[string]string{}}
	w.slots[slot] = p
	w.byKubelet[w.n.k.PodName(name)] = p
	w.created++
	return nil
}

// deleteLocked removes slot's manifest: the kubelet stops the pod. A
// not-Ready time still open is cut here. Caller holds mu.
func (w *workload) deleteLocked(slot int) error {
	p := w.slots[slot]
	if p == nil {
		return nil
	}
	if err := os.Remove(filepath.Join(w.n.k.Manifests, p.name+".yaml")); err != nil {
		return fmt.Errorf("delete pod %s: %w", p.name, err)
	}
	now := time.Now()
	p.deleted = now
	w.closeLocked(p, now, true)
	w.slots[slot] = nil
	return nil
}

func (w *workload) closeLocked(p *podTrack, now time.Time, cut bool) {
	switch {
	case p.firstReady.IsZero() && !p.startCut:
		w.intervals = append(w.intervals, interval{Pod: p.name, Kind: "start", Start: p.applied, End: now, Cut: cut})
		p.startCut = true
	case !p.notReadySince.IsZero():
		w.intervals = append(w.intervals, interval{Pod: p.name, Kind: "not-ready", Start: p.notReadySince, End: now, Cut: cut})
		p.notReadySince = time.Time{}
	}
}

// fill applies every slot's first pod at once.
func (w *workload) fill() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for slot := range w.slots {
		if err := w.applyLocked(slot); err != nil {
			return err
		}
	}
	return nil
}

// replace replaces the pod of a random slot (churn): its manifest goes,
// the next generation's comes. It returns the new pod's name.
func (w *workload) replace() (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	slot := w.rng.IntN(len(w.slots))
	if err := w.deleteLocked(slot); err != nil {
		return "", err
	}
	if err := w.applyLocked(slot); err != nil {
		return "", err
	}
	return w.slots[slot].name, nil
}

// removeAll deletes every manifest (teardown).
func (w *workload) removeAll() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for slot := range w.slots {
		if err := w.deleteLocked(slot); err != nil {
			return err
		}
	}
	return nil
}

// poll reads the kubelet's /pods once and updates every pod's readiness
// and restart counts.
func (w *workload) poll() {
	list, err := kubelettest.PodList[corev1.Pod](w.n.k)
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.pollErrs++
		w.lastErr = err.Error()
		return
	}
	for i := range list {
		pod := &list[i]
		p := w.byKubelet[pod.Name]
		if p == nil {
			continue
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.RestartCount > p.restarts[s.Name] {
				p.restarts[s.Name] = s.RestartCount
				// A previous instance that never started (its create cut
				// by a berthd kill: the kubelet saw it listed, created,
				// and made the next) is not a restart of a running one.
				ran, how := false, "no last state"
				if t := s.LastTerminationState.Terminated; t != nil {
					ran = !t.StartedAt.IsZero()
					how = fmt.Sprintf("last: %s exit %d, started %v", t.Reason, t.ExitCode, ran)
				}
				p.ran[s.Name], p.lastTerm[s.Name] = ran, how
			}
		}
		if !p.deleted.IsZero() {
			continue
		}
		ready := false
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = c.Status == corev1.ConditionTrue
			}
		}
		switch {
		case ready && p.firstReady.IsZero():
			p.firstReady = now
			w.intervals = append(w.intervals, interval{Pod: p.name, Kind: "start", Start: p.applied, End: now})
		case ready && !p.notReadySince.IsZero():
			w.intervals = append(w.intervals, interval{Pod: p.name, Kind: "not-ready", Start: p.notReadySince, End: now})
			p.notReadySince = time.Time{}
		case !ready && !p.firstReady.IsZero() && p.notReadySince.IsZero():
			p.notReadySince = now
		}
		p.ready = ready
	}
}

// readyCount is how many live pods are Ready, of how many.
func (w *workload) readyCount() (ready, live int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.slots {
		if p != nil {
			live++
			if p.ready && !p.firstReady.IsZero() {
				ready++
			}
		}
	}
	return ready, live
}

// readyNames are the live pods Ready now.
func (w *workload) readyNames() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for _, p := range w.slots {
		if p != nil && p.ready {
			out[p.name] = true
		}
	}
	return out
}

// allReadyOf says whether each pod of names still live is Ready.
func (w *workload) allReadyOf(names map[string]bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.slots {
		if p != nil && names[p.name] && !p.ready {
			return false
		}
	}
	return true
}

// loggerPod is a random live, Ready pod with a logger ("" if none).
func (w *workload) loggerPod() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var names []string
	for _, p := range w.slots {
		if p != nil && p.ready && hasLogger(p.slot) {
			names = append(names, p.name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return names[w.rng.IntN(len(names))]
}

// finish cuts every open not-Ready time at the end of the run.
func (w *workload) finish(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.slots {
		if p != nil {
			w.closeLocked(p, now, true)
		}
	}
}

// restarted lists every container the kubelet restarted (restartCount
// above 0): the churn replaces pods, never containers, so each is a
// restart the churn did not cause.
//
// A container whose previous instance never started (its create cut by
// a fault: the kubelet saw it listed and made the next) is counted
// apart, in recreated.
func (w *workload) restarted() (total int, which []string, recreated int, how []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.byKubelet {
		for c, n := range p.restarts {
			if n == 0 {
				continue
			}
			line := fmt.Sprintf("%s/%s ×%d (%s)", p.name, c, n, orDash(p.lastTerm[c]))
			if p.ran[c] {
				total += int(n)
				which = append(which, line)
			} else {
				recreated += int(n)
				how = append(how, line)
			}
		}
	}
	sort.Strings(which)
	sort.Strings(how)
	return total, which, recreated, how
}

// counter is ok/error counts of one kind of request, between and during
// faults.
type counter struct {
	OK     [2]int `json:"ok"`
	Errors [2]int `json:"errors"`
	// LastError is the last error seen between faults and during one
	// (an error between faults is the one to explain).
	LastError [2]string `json:"last_error"`
}

// phase is 0 between faults, 1 during one (from its injection to its
// recovery).
type phase = int

// observers run beside the churn and the faults: the soak's own CRI
// client, the kubelet's log and stats reads.
type observers struct {
	n *node
	w *workload
	// faultActive is set from a fault's injection to its recovery.
	faultActive atomic.Bool

	mu        sync.Mutex
	latencies map[string]*[2][]time.Duration // CRI method → between/during
	cri       map[string]*counter
	kubelet   map[string]*counter // "containerLogs", "stats/summary"
}

func newObservers(n *node, w *workload) *observers {
	return &observers{n: n, w: w, latencies: map[string]*[2][]time.Duration{}, cri: map[string]*counter{}, kubelet: map[string]*counter{}}
}

func (o *observers) phase() phase {
	if o.faultActive.Load() {
		return 1
	}
	return 0
}

func (o *observers) record(m map[string]*counter, what string, ph phase, err error) {
	c := m[what]
	if c == nil {
		c = &counter{}
		m[what] = c
	}
	if err != nil {
		c.Errors[ph]++
		c.LastError[ph] = err.Error()
		return
	}
	c.OK[ph]++
}

// timed calls one CRI method with a 30 s deadline and records its
// latency and error in the phase it started or ended in.
func (o *observers) timed(ctx context.Context, method string, call func(ctx context.Context) error) {
	ph := o.phase()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	start := time.Now()
	err := call(cctx)
	took := time.Since(start)
	cancel()
	if ctx.Err() != nil {
		return
	}
	ph = max(ph, o.phase())
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.latencies[method]
	if l == nil {
		l = &[2][]time.Duration{}
		o.latencies[method] = l
	}
	l[ph] = append(l[ph], took)
	o.record(o.cri, method, ph, err)
}

// criLoop is the soak's own CRI client: every 2 s ListContainers,
// ContainerStatus and ExecSync of a random running container, and
// ListContainerStats, until ctx ends.
func (o *observers) criLoop(ctx context.Context, rng *rand.Rand) {
	rt := o.n.d.Runtime
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var running []string
		o.timed(ctx, "ListContainers", func(ctx context.Context) error {
			r, err := rt.ListContainers(ctx, &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{
				State: &criapi.ContainerStateValue{State: criapi.ContainerState_CONTAINER_RUNNING}}})
			for _, c := range r.GetContainers() {
				running = append(running, c.Id)
			}
			return err
		})
		o.timed(ctx, "ListContainerStats", func(ctx context.Context) error {
			_, err := rt.ListContainerStats(ctx, &criapi.ListContainerStatsRequest{})
			return err
		})
		if len(running) == 0 {
			continue
		}
		id := running[rng.IntN(len(running))]
		o.timed(ctx, "ContainerStatus", func(ctx context.Context) error {
			_, err := rt.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id})
			return ignoreGone(err)
		})
		o.timed(ctx, "ExecSync", func(ctx context.Context) error {
			r, err := rt.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"true"}, Timeout: 10})
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("exec true: exit %d: %s", r.ExitCode, r.Stderr)
			}
			return ignoreGone(err)
		})
	}
}

// ignoreGone passes over a container the churn removed between the list
// and the call.
func ignoreGone(err error) error {
	if err != nil && (strings.Contains(err.Error(), "NotFound") || strings.Contains(err.Error(), "not running")) {
		return nil
	}
	return err
}

// kubeletLoop reads, every 10 s, the kubelet's /stats/summary (its CRI
// stats calls) and the last lines of a random logger's log through
// /containerLogs (kubectl logs' path: the CRI log file), until ctx ends.
func (o *observers) kubeletLoop(ctx context.Context) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	k := o.n.k
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ph := o.phase()
		_, err := k.Get(k.APIURL("/stats/summary", nil))
		if ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		o.record(o.kubelet, "stats/summary", max(ph, o.phase()), err)
		o.mu.Unlock()
		pod := o.w.loggerPod()
		if pod == "" {
			continue
		}
		ph = o.phase()
		body, err := k.Get(k.APIURL(fmt.Sprintf("/containerLogs/default/%s/logger", k.PodName(pod)), url.Values{"tailLines": {"5"}}))
		if err == nil && !strings.Contains(string(body), pod+" tick") {
			// Only a pod just Ready may have logged nothing yet.
			err = fmt.Errorf("log of %s/logger has no tick: %q", pod, body)
		}
		if ctx.Err() != nil {
			return
		}
		o.mu.Lock()
		o.record(o.kubelet, "containerLogs", max(ph, o.phase()), err)
		o.mu.Unlock()
	}
}
