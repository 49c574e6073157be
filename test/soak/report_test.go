package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// faultRecord is one injected fault.
type faultRecord struct {
	Kind      string    `json:"kind"`
	At        time.Time `json:"at"`
	DurationS float64   `json:"duration_s"`
	Note      string    `json:"note"`
	// Finding is what berth got wrong during it ("" if nothing).
	Finding string `json:"finding,omitempty"`
	// RecoveredS is from the fault's end to every pod Ready at its start
	// Ready again, berthd serving and a monitor up.
	RecoveredS float64 `json:"recovered_s"`
	Recovered  bool    `json:"recovered"`
	BoundS     float64 `json:"bound_s"`
	end        time.Time
}

// procSample is one process kind's resources at one moment.
type procSample struct {
	Count      int    `json:"count"`
	RSSKiB     uint64 `json:"rss_kib"`
	FDs        int    `json:"fds"`
	Threads    int    `json:"threads"`
	Goroutines int    `json:"goroutines,omitempty"`
}

// sample is the node's processes at one point of the run.
type sample struct {
	Phase    string     `json:"phase"`
	At       time.Time  `json:"at"`
	Berthd   procSample `json:"berthd"`
	Keepers  procSample `json:"keepers"`
	Monitors procSample `json:"monitors"`
}

// rpcStats is one CRI method's latencies between and during faults.
type rpcStats struct {
	Count  [2]int     `json:"count"`
	P50Ms  [2]float64 `json:"p50_ms"`
	P99Ms  [2]float64 `json:"p99_ms"`
	MaxMs  [2]float64 `json:"max_ms"`
	Errors [2]int     `json:"errors"`
	// LastError is the last failure's text, between faults and during one.
	LastError [2]string `json:"last_error"`
}

// violation is a pod not Ready past its bound.
type violation struct {
	interval
	LengthS  float64 `json:"length_s"`
	AllowedS float64 `json:"allowed_s"`
	// Fault is the fault the time is charged to ("" outside faults).
	Fault string `json:"fault,omitempty"`
}

// report is the soak's result: the markdown table and the JSON file.
type report struct {
	n *node
	w *workload
	o *observers

	Seed           uint64    `json:"seed"`
	Minutes        float64   `json:"minutes"`
	Pods           int       `json:"pods"`
	ChurnPerMinute int       `json:"churn_per_minute"`
	Started        time.Time `json:"started"`
	FillS          float64   `json:"fill_s"`
	PodsCreated    int       `json:"pods_created"`
	Restarts       int       `json:"restarts"`
	RestartedCtrs  []string  `json:"restarted_containers,omitempty"`
	// Recreated are containers made again because their first create
	// was cut by a fault (never started): reported, not a restart.
	Recreated     int                  `json:"recreated"`
	RecreatedCtrs []string             `json:"recreated_containers,omitempty"`
	Faults        []faultRecord        `json:"faults"`
	Violations    []violation          `json:"violations,omitempty"`
	NotReadyTimes int                  `json:"not_ready_times"`
	RPC           map[string]*rpcStats `json:"rpc"`
	Kubelet       map[string]*counter  `json:"kubelet_reads"`
	Samples       []sample             `json:"samples"`
	// Growth is end over after-warm-up, per process of a kind, in %.
	Growth map[string]float64 `json:"growth_pct"`
	// Teardown: what was left, and the image store's accounting.
	Leaks             []string `json:"leaks"`
	KubeletLeftPods   int      `json:"kubelet_left_pods"`
	ImageFsUsedBytes  uint64   `json:"imagefs_used_bytes"`
	DuBytes           uint64   `json:"du_bytes"`
	UnreferencedBlobs []string `json:"unreferenced_blobs"`
	Findings          []string `json:"findings,omitempty"`
	TeardownS         float64  `json:"teardown_s"`

	mu       sync.Mutex
	fillDone time.Time
	ended    time.Time
}

func newReport(p params, n *node, w *workload, o *observers) *report {
	return &report{n: n, w: w, o: o, Seed: p.Seed, Minutes: p.Minutes, Pods: p.Pods, ChurnPerMinute: p.Churn,
		Started: time.Now(), Growth: map[string]float64{}}
}

func (r *report) addFault(f faultRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Faults = append(r.Faults, f)
}

func (r *report) addFinding(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Findings = append(r.Findings, err.Error())
}

// sample records the node's processes now.
func (r *report) sample(phase string) {
	s := sample{Phase: phase, At: time.Now()}
	s.Berthd = procs([]int{r.n.d.Pid()})
	s.Berthd.Goroutines = int(metric(r.n.http, r.n.metricsURL, "go_goroutines"))
	s.Keepers = procs(berthdtest.ShimPids(r.n.d.State, "keeper"))
	s.Monitors = procs(berthdtest.ShimPids(r.n.d.State, "monitor"))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Samples = append(r.Samples, s)
}

// procs sums RSS, open fds and threads of pids (from /proc).
func procs(pids []int) procSample {
	var s procSample
	for _, pid := range pids {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		s.Count++
		for _, l := range strings.Split(string(status), "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			v, _ := strconv.ParseUint(f[1], 10, 64)
			switch f[0] {
			case "VmRSS:":
				s.RSSKiB += v
			case "Threads:":
				s.Threads += int(v)
			}
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		s.FDs += len(fds)
	}
	return s
}

// metric reads one unlabelled gauge from a Prometheus endpoint (-1 if
// it cannot).
func metric(c *http.Client, url, name string) float64 {
	resp, err := c.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func quantile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return float64(s[max(0, i)].Microseconds()) / 1000
}

// finish computes what the run's raw records say: restarts, pods not
// Ready past their bound, RPC quantiles, resource growth.
func (r *report) finish() {
	r.Restarts, r.RestartedCtrs, r.Recreated, r.RecreatedCtrs = r.w.restarted()
	r.w.mu.Lock()
	r.PodsCreated = r.w.created
	intervals := append([]interval(nil), r.w.intervals...)
	r.w.mu.Unlock()
	for _, iv := range intervals {
		// The node's first fill is the warm-up, not the soak; teardown
		// is not the soak either.
		if iv.Start.Before(r.fillDone) || !iv.Start.Before(r.ended) {
			continue
		}
		if iv.Kind == "not-ready" {
			r.NotReadyTimes++
		}
		base := notReadyBound
		if iv.Kind == "start" {
			base = startBound
		}
		base = time.Duration(float64(base) * r.n.p.BoundScale)
		// A fault overlapping the time allows it to last until the
		// fault's end plus its bound.
		allowedEnd, charged := iv.Start.Add(base), ""
		for _, f := range r.Faults {
			e := f.end.Add(time.Duration(f.BoundS * float64(time.Second)))
			if f.At.Before(iv.End) && !f.end.Before(iv.Start) && e.After(allowedEnd) {
				allowedEnd, charged = e, f.Kind
			}
		}
		if iv.End.After(allowedEnd) {
			r.Violations = append(r.Violations, violation{interval: iv, LengthS: iv.length().Seconds(),
				AllowedS: allowedEnd.Sub(iv.Start).Seconds(), Fault: charged})
		}
	}
	r.o.mu.Lock()
	r.RPC = map[string]*rpcStats{}
	for m, l := range r.o.latencies {
		s := &rpcStats{}
		for ph := range 2 {
			s.Count[ph] = len(l[ph])
			s.P50Ms[ph], s.P99Ms[ph], s.MaxMs[ph] = quantile(l[ph], 0.5), quantile(l[ph], 0.99), quantile(l[ph], 1)
		}
		if c := r.o.cri[m]; c != nil {
			s.Errors, s.LastError = c.Errors, c.LastError
		}
		r.RPC[m] = s
	}
	r.Kubelet = r.o.kubelet
	r.o.mu.Unlock()
	var warm, end *sample
	for i := range r.Samples {
		switch r.Samples[i].Phase {
		case "after warm-up":
			warm = &r.Samples[i]
		case "end":
			end = &r.Samples[i]
		}
	}
	if warm != nil && end != nil {
		pct := func(a, b float64) float64 {
			if a <= 0 || b < 0 {
				return math.NaN()
			}
			return (b - a) / a * 100
		}
		// Per process: a keeper-kill leaves an orphaned monitor beside the
		// next one until its pods go, which doubles the sum, not the use.
		per := func(v, n int) float64 {
			if n == 0 {
				return 0
			}
			return float64(v) / float64(n)
		}
		for _, k := range []struct {
			name   string
			wa, en procSample
		}{{"berthd", warm.Berthd, end.Berthd}, {"keeper", warm.Keepers, end.Keepers}, {"monitor", warm.Monitors, end.Monitors}} {
			r.Growth[k.name+" rss"] = pct(per(int(k.wa.RSSKiB), k.wa.Count), per(int(k.en.RSSKiB), k.en.Count))
			r.Growth[k.name+" fds"] = pct(per(k.wa.FDs, k.wa.Count), per(k.en.FDs, k.en.Count))
			r.Growth[k.name+" threads"] = pct(per(k.wa.Threads, k.wa.Count), per(k.en.Threads, k.en.Count))
		}
		r.Growth["berthd goroutines"] = pct(float64(warm.Berthd.Goroutines), float64(end.Berthd.Goroutines))
	}
}

// failures are the goals the run missed that fail the test.
func (r *report) failures() []string {
	var out []string
	if r.Restarts > 0 {
		out = append(out, fmt.Sprintf("%d container restarts the churn did not cause: %s", r.Restarts, strings.Join(r.RestartedCtrs, ", ")))
	}
	for _, v := range r.Violations {
		out = append(out, fmt.Sprintf("pod %s not Ready (%s) for %.1f s from %s, allowed %.1f s (%s)", v.Pod, v.Kind, v.LengthS,
			v.Start.Format(time.TimeOnly), v.AllowedS, orDash(v.Fault)))
	}
	for _, f := range r.Faults {
		if !f.Recovered {
			out = append(out, fmt.Sprintf("fault %s at %s: not recovered within 3× its bound (%.0f s)", f.Kind, f.At.Format(time.TimeOnly), 3*f.BoundS))
		}
		if f.Finding != "" {
			out = append(out, fmt.Sprintf("fault %s at %s: %s", f.Kind, f.At.Format(time.TimeOnly), f.Finding))
		}
	}
	for _, l := range r.Leaks {
		out = append(out, "left after teardown: "+l)
	}
	for _, b := range r.UnreferencedBlobs {
		out = append(out, "left in the image store: "+b)
	}
	if !r.duMatches() {
		out = append(out, fmt.Sprintf("ImageFsInfo says %d bytes used, du %d", r.ImageFsUsedBytes, r.DuBytes))
	}
	out = append(out, r.Findings...)
	return out
}

// duMatches says whether ImageFsInfo and du agree (within 1% or 64 KiB:
// directories' sizes move as entries come and go).
func (r *report) duMatches() bool {
	diff := math.Abs(float64(r.ImageFsUsedBytes) - float64(r.DuBytes))
	return diff <= max(64<<10, float64(r.DuBytes)/100)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}

func goal(ok bool) string {
	if ok {
		return "met"
	}
	return "**MISSED**"
}

// markdown is the report as docs/reliability.md's Soak section shows it.
func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Soak: %g minutes, %d pods, %d replaced a minute, seed %d\n\n", r.Minutes, r.Pods, r.ChurnPerMinute, r.Seed)
	fmt.Fprintf(&b, "Node full (all Ready) in %.0f s; %d pods created in all; %d faults; teardown %.0f s.\n\n", r.FillS, r.PodsCreated, len(r.Faults), r.TeardownS)
	b.WriteString("| goal | result | |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| containers restarted that the churn did not replace: 0 | %d | %s |\n", r.Restarts, goal(r.Restarts == 0))
	if r.Recreated > 0 {
		fmt.Fprintf(&b, "| (containers made again after a fault cut their create: they never ran) | %d: %s | |\n", r.Recreated, strings.Join(r.RecreatedCtrs, ", "))
	}
	fmt.Fprintf(&b, "| pods not Ready past their fault's bound: 0 | %d (of %d not-Ready times and %d starts) | %s |\n",
		len(r.Violations), r.NotReadyTimes, r.PodsCreated-r.Pods, goal(len(r.Violations) == 0))
	recovered := 0
	for _, f := range r.Faults {
		if f.Recovered && f.Finding == "" {
			recovered++
		}
	}
	fmt.Fprintf(&b, "| faults recovered cleanly | %d of %d | %s |\n", recovered, len(r.Faults), goal(recovered == len(r.Faults)))
	flat := true
	for k, g := range r.Growth {
		if !math.IsNaN(g) && g > 10 && !strings.HasSuffix(k, "threads") {
			flat = false
		}
	}
	fmt.Fprintf(&b, "| RSS, goroutines, fds flat after warm-up (within 10%%) | see below | %s |\n", goal(flat))
	fmt.Fprintf(&b, "| left after teardown (mounts, netns, cgroups, processes, iptables, state and root entries) | %d | %s |\n", len(r.Leaks), goal(len(r.Leaks) == 0))
	fmt.Fprintf(&b, "| blobs and ingest files no image references | %d | %s |\n", len(r.UnreferencedBlobs), goal(len(r.UnreferencedBlobs) == 0))
	fmt.Fprintf(&b, "| ImageFsInfo = du | %d / %d bytes | %s |\n", r.ImageFsUsedBytes, r.DuBytes, goal(r.duMatches()))

	b.WriteString("\nFaults (recovery: from the fault's end until every pod Ready at its start is Ready again, berthd serves and a monitor runs):\n\n")
	b.WriteString("| fault | times | bound s | recovery max s | not recovered | findings |\n|---|---:|---:|---:|---:|---:|\n")
	type agg struct {
		n, bad, findings int
		max, bound       float64
	}
	byKind := map[string]*agg{}
	for _, f := range r.Faults {
		a := byKind[f.Kind]
		if a == nil {
			a = &agg{bound: f.BoundS}
			byKind[f.Kind] = a
		}
		a.n++
		a.max = max(a.max, f.RecoveredS)
		if !f.Recovered {
			a.bad++
		}
		if f.Finding != "" {
			a.findings++
		}
	}
	for _, k := range faultNames() {
		if a := byKind[k]; a != nil {
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.1f | %d | %d |\n", k, a.n, a.bound, a.max, a.bad, a.findings)
		}
	}

	b.WriteString("\nThe soak's CRI calls (every 2 s), ms, between faults / during faults:\n\n")
	b.WriteString("| RPC | calls | p50 | p99 | max | errors |\n|---|---:|---:|---:|---:|---:|\n")
	for _, m := range slices.Sorted(maps.Keys(r.RPC)) {
		s := r.RPC[m]
		fmt.Fprintf(&b, "| %s | %d / %d | %s / %s | %s / %s | %s / %s | %d / %d |\n", m, s.Count[0], s.Count[1],
			ms(s.P50Ms[0]), ms(s.P50Ms[1]), ms(s.P99Ms[0]), ms(s.P99Ms[1]), ms(s.MaxMs[0]), ms(s.MaxMs[1]), s.Errors[0], s.Errors[1])
	}
	for _, m := range slices.Sorted(maps.Keys(r.RPC)) {
		if e := r.RPC[m].LastError[0]; e != "" {
			fmt.Fprintf(&b, "\n%s's last error between faults: %s\n", m, e)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Kubelet)) {
		c := r.Kubelet[k]
		fmt.Fprintf(&b, "\nThe kubelet's %s (every 10 s): %d / %d ok, %d / %d failed (between / during faults).", k, c.OK[0], c.OK[1], c.Errors[0], c.Errors[1])
		if c.LastError[0] != "" {
			fmt.Fprintf(&b, " Last error between faults: %s.", c.LastError[0])
		}
	}
	b.WriteString("\n\nThe node's processes (RSS MiB, open fds, threads; berthd's goroutines from its metrics):\n\n")
	b.WriteString("| when | berthd RSS | fds | goroutines | keepers | RSS | fds | monitors | RSS | fds |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Samples {
		fmt.Fprintf(&b, "| %s | %.1f | %d | %d | %d | %.1f | %d | %d | %.1f | %d |\n", s.Phase,
			float64(s.Berthd.RSSKiB)/1024, s.Berthd.FDs, s.Berthd.Goroutines,
			s.Keepers.Count, float64(s.Keepers.RSSKiB)/1024, s.Keepers.FDs,
			s.Monitors.Count, float64(s.Monitors.RSSKiB)/1024, s.Monitors.FDs)
	}
	if len(r.Growth) > 0 {
		b.WriteString("\nEnd over after warm-up, per process:")
		for _, k := range slices.Sorted(maps.Keys(r.Growth)) {
			fmt.Fprintf(&b, " %s %+.0f%%;", k, r.Growth[k])
		}
		b.WriteString(" (a berthd, keeper or monitor a fault replaced starts small again)\n")
	}
	if fails := r.failures(); len(fails) > 0 {
		b.WriteString("\nMissed:\n\n")
		for _, f := range fails {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	return b.String()
}

// write prints the markdown to w and writes soak.json (and the daemons'
// logs) to dir.
func (r *report) write(w io.Writer, dir string) error {
	md := r.markdown()
	if _, err := io.WriteString(w, md); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// NaN has no JSON form.
	for _, s := range r.RPC {
		for ph := range 2 {
			for _, p := range []*float64{&s.P50Ms[ph], &s.P99Ms[ph], &s.MaxMs[ph]} {
				if math.IsNaN(*p) {
					*p = -1
				}
			}
		}
	}
	for k, g := range r.Growth {
		if math.IsNaN(g) {
			delete(r.Growth, k)
		}
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.json"), data, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "soak.md"), []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nsoak: report in %s (soak.json, soak.md, berthd.log, kubelet.log)\n", dir)
	return nil
}
