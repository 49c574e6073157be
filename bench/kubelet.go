package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/kubelettest"
)

// One standalone kubelet (internal/testutil/kubelettest, which the
// kubelet tests use too), static pods only, on any CRI endpoint, with
// everything it writes below one directory.

// KubeletBinDir returns the directory holding the kubelet built by
// hack/k8s-bins.sh (built on first use, then cached), or
// $BERTH_K8S_BIN_DIR when set.
func KubeletBinDir(tb testing.TB) string {
	tb.Helper()
	return kubelettest.BinDir(tb, "kubelet")
}

// Kubelet is one standalone kubelet process on an Endpoint.
type Kubelet struct {
	*kubelettest.Kubelet
}

// KubeletPod is the part of a pod the benchmark reads from /pods.
type KubeletPod = kubelettest.Pod

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
	// Registered first, so run last: after the kubelet's own cleanup.
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove the kubelet's dir: %v", err)
		}
	})
	k := kubelettest.Start(tb, KubeletBinDir(tb), kubelettest.Options{
		Dir:           dir,
		Endpoint:      ep.Socket,
		CgroupDriver:  "cgroupfs",
		ExtraConfig:   config,
		NodePrefix:    "bench-",
		CgroupPrefix:  "benchkl",
		StartTimeout:  2 * time.Minute,
		ClientTimeout: 60 * time.Second,
		AfterStop:     func(k *kubelettest.Kubelet) { afterKubelet(tb, ep, k) },
	})
	return &Kubelet{k}
}

// afterKubelet keeps the stopped kubelet's log in $BENCH_OUT and removes
// through CRI the pods it left (its garbage collection may not have come
// round yet), before kubelettest removes its cgroups and mounts.
func afterKubelet(tb testing.TB, ep *Endpoint, k *kubelettest.Kubelet) {
	if out := os.Getenv("BENCH_OUT"); out != "" {
		// The kubelet's log, to see where a run's time went.
		if data, err := os.ReadFile(k.LogFile); err == nil {
			_ = os.WriteFile(filepath.Join(out, "kubelet_fullnode."+ep.Name+".log"), data, 0o644)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if list, err := sandboxesOf(ctx, ep, k.NodeName); err == nil {
		for _, s := range list {
			if err := removePod(ctx, ep, s.Id); err != nil {
				tb.Errorf("remove pod %s the kubelet left: %v", s.Id, err)
			}
		}
	}
}

// Sandboxes lists the runtime's sandboxes of this kubelet's pods (a
// reference runtime given by BENCH_REF_ENDPOINT may have others).
func (k *Kubelet) Sandboxes(ctx context.Context, ep *Endpoint) ([]*criapi.PodSandbox, error) {
	return sandboxesOf(ctx, ep, k.NodeName)
}

func sandboxesOf(ctx context.Context, ep *Endpoint, node string) ([]*criapi.PodSandbox, error) {
	list, err := ep.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("list pod sandboxes: %w", err)
	}
	var out []*criapi.PodSandbox
	for _, s := range list.Items {
		if strings.HasSuffix(s.GetMetadata().GetName(), "-"+node) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Metrics is the kubelet's /metrics (Prometheus text).
func (k *Kubelet) Metrics() (string, error) {
	body, err := k.Get(fmt.Sprintf("https://127.0.0.1:%d/metrics", k.Port))
	return string(body), err
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
