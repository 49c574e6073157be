package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"golang.org/x/sync/errgroup"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Goals of issue 36 for BenchmarkLazyPull.
const (
	lazyGoalVsReference = 0.1 // ready ≤ 0.1× the reference's full pull
	lazyGoalVsFloor     = 2.0 // ready ≤ 2× the floor
	lazyGoalRead        = 0.8 // fully fetched lazy layer reads ≥ 0.8× overlayfs
)

// lazySeries names the series of BenchmarkLazyPull.
type lazySeries struct{ ready, pull, complete string }

func newLazySeries(li *LazyImage, readBytes int64, shape Shape) lazySeries {
	what := fmt.Sprintf("%d layers eStargz, %d MB blobs, %d MB unpacked, %d MB weights; runs gofmt, reads %d MB of them; registry %s",
		len(li.Layers), li.Compressed>>20, li.Unpacked>>20, li.WeightsBytes>>20, readBytes>>20, shape)
	return lazySeries{
		ready:    "PullImage → container ready (" + what + ")",
		pull:     "PullImage alone (part of the above)",
		complete: "PullImage → background fetch complete (lazy only)",
	}
}

// lazyReads collects, per endpoint, the times to read the whole weights
// file through a running container's root once its image is whole: a
// lazy layer after its background fetch, or overlayfs over a full pull.
type lazyReads struct {
	mu           sync.Mutex
	first, again map[string][]time.Duration
}

func (r *lazyReads) add(ep string, first, again time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.first == nil {
		r.first, r.again = map[string][]time.Duration{}, map[string][]time.Duration{}
	}
	r.first[ep] = append(r.first[ep], first)
	r.again[ep] = append(r.again[ep], again)
}

// throughputs are the reads as throughput series, endpoints in order.
func (r *lazyReads) throughputs(eps []string, bytes int64) []Throughput {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Throughput
	for _, e := range eps {
		if len(r.first[e]) == 0 {
			continue
		}
		out = append(out,
			Throughput{Name: e + ": first read of the weights, image whole", Bytes: bytes, Samples: r.first[e]},
			Throughput{Name: e + ": read again", Bytes: bytes, Samples: r.again[e]})
	}
	return out
}

// isLazy reports whether ep is a berthd with lazy pulling on.
func isLazy(ep *Endpoint) bool {
	return ep.Daemon != nil && ep.Daemon.Config != nil && ep.Daemon.Config.ImageLazyPull.Enable
}

// LazyPullWorkload starts a container on the lazy image ref from a
// shaped registry, timed from PullImage to the container's "ready" (its
// program ran and it read readBytes of the weights); on a lazy endpoint
// also to the end of the background fetch. Then, with the image whole,
// it reads the weights through the container's root (reads). Each sample
// starts with the image removed and a settled disk, the pod already up
// (the kubelet runs the sandbox before it pulls).
func LazyPullWorkload(li *LazyImage, reg *ShapedRegistry, ref string, readBytes int64, warm int, reads *lazyReads) Workload {
	series := newLazySeries(li, readBytes, reg.Shape)
	script := fmt.Sprintf("echo 'package main' | /%s >/dev/null && head -c %d /%s >/dev/null && echo ready; while :; do sleep 1; done",
		lazyProgram, readBytes, lazyWeightsPath)
	return Workload{
		Name: "lazy pull", Samples: 3, Warmup: warm,
		Floor: lazyFloor(li, reg, ref, readBytes, series.ready),
		Sample: func(ctx context.Context, ep *Endpoint, _ any, i int) (map[string]time.Duration, error) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
			defer cancel()
			pc := podConfig(ep, "lazy")
			pod, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
			if err != nil {
				return nil, unsupported(err)
			}
			removed := false
			defer func() {
				if !removed {
					removePod(context.WithoutCancel(ctx), ep, pod.PodSandboxId)
				}
			}()
			if err := removeImage(ctx, ep, ref); err != nil {
				return nil, unsupported(err)
			}
			syscall.Sync()
			settleFreedInodes()
			// The marker names this container's process, to find its root.
			marker := fmt.Sprintf("lazybench-%s-%d", ep.Name, names.next())
			cc := containerConfig(ref, "sh", "-c", script, marker)
			logPath := filepath.Join(pc.LogDirectory, cc.LogPath)
			start := time.Now()
			if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
				return nil, unsupported(err)
			}
			pulled := time.Since(start)
			c, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: cc, SandboxConfig: pc})
			if err != nil {
				return nil, unsupported(err)
			}
			if _, err := ep.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
				return nil, unsupported(err)
			}
			if err := waitReady(ctx, ep, c.ContainerId, logPath); err != nil {
				return nil, err
			}
			res := map[string]time.Duration{series.ready: time.Since(start), series.pull: pulled}
			if isLazy(ep) {
				if err := waitBlobs(ctx, ep, li); err != nil {
					return nil, err
				}
				res[series.complete] = time.Since(start)
			}
			first, again, err := readWeights(marker)
			if err != nil {
				return nil, err
			}
			if i >= warm {
				reads.add(ep.Name, first, again)
			}
			removed = true
			if err := removePod(ctx, ep, pod.PodSandboxId); err != nil {
				return nil, err
			}
			if err := removeImage(ctx, ep, ref); err != nil {
				return nil, unsupported(err)
			}
			return res, nil
		},
		Teardown: func(ctx context.Context, ep *Endpoint, _ any) { removeImage(ctx, ep, ref) },
	}
}

// waitReady polls the container's log for its "ready" line; a container
// that exits without it is an error, with its log.
func waitReady(ctx context.Context, ep *Endpoint, id, logPath string) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		data, _ := os.ReadFile(logPath)
		if strings.Contains(string(data), " F ready\n") {
			return nil
		}
		if n%50 == 49 {
			st, err := ep.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id})
			if err != nil {
				return fmt.Errorf("wait for the lazy container: %w", err)
			}
			if st.Status.State == criapi.ContainerState_CONTAINER_EXITED {
				return fmt.Errorf("lazy container exited %d before ready: %s", st.Status.ExitCode, data)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the lazy container's ready: %w (log: %s)", ctx.Err(), data)
		case <-tick.C:
		}
	}
}

// waitBlobs waits until berthd's store holds every blob of li and every
// lazy layer has written its files out: the background fetch has
// completed, committed and verified them, and the layers serve their
// files from disk (decision 3600, S3).
func waitBlobs(ctx context.Context, ep *Endpoint, li *LazyImage) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		whole := true
		for _, l := range li.Layers {
			if _, err := os.Stat(filepath.Join(ep.Daemon.Root, "images", "blobs", "sha256", strings.TrimPrefix(l.Digest, "sha256:"))); err != nil {
				whole = false
				break
			}
		}
		metas, _ := filepath.Glob(filepath.Join(ep.Daemon.Root, "images", "layers", "*", "lazy.json"))
		for _, m := range metas {
			if _, err := os.Stat(filepath.Join(filepath.Dir(m), "cache", "files")); err != nil {
				whole = false
				break
			}
		}
		if whole {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the background fetch: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// readWeights reads the weights file twice through the root of the
// process whose command line holds marker (the container's shell), and
// times each read.
func readWeights(marker string) (first, again time.Duration, err error) {
	var path string
	for _, pid := range processesMentioning(marker) {
		p := fmt.Sprintf("/proc/%d/root/%s", pid, lazyWeightsPath)
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		return 0, 0, fmt.Errorf("no process of the lazy container (%s) with %s in its root", marker, lazyWeightsPath)
	}
	read := func() (time.Duration, error) {
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		buf := copyBufs.Get().(*[]byte)
		defer copyBufs.Put(buf)
		start := time.Now()
		_, err = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, *buf)
		return time.Since(start), err
	}
	if first, err = read(); err != nil {
		return 0, 0, fmt.Errorf("read the weights through the container's root: %w", err)
	}
	if again, err = read(); err != nil {
		return 0, 0, fmt.Errorf("read the weights through the container's root: %w", err)
	}
	return first, again, nil
}

// blobSpan is a range of a blob: [start, end).
type blobSpan struct {
	digest     string
	start, end int64
}

// lazySpans are the compressed ranges of li's blobs that hold what the
// container reads (lazyReadPaths), one per file, from each layer's TOC.
func lazySpans(li *LazyImage, readBytes int64) ([]blobSpan, error) {
	want := lazyReadPaths(readBytes)
	var spans []blobSpan
	for _, l := range li.Layers {
		f, err := os.Open(l.Path)
		if err != nil {
			return nil, err
		}
		r, err := estargz.Open(io.NewSectionReader(f, 0, l.Size))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("read the TOC of %s: %w", l.Digest, err)
		}
		for p, n := range want {
			e, ok := r.Lookup(p)
			if !ok || e.Type != "reg" {
				continue
			}
			if n <= 0 || n > e.Size {
				n = e.Size
			}
			end := e.NextOffset()
			if last, ok := r.ChunkEntryForOffset(p, n-1); ok {
				end = last.NextOffset()
			}
			spans = append(spans, blobSpan{digest: l.Digest, start: e.Offset, end: end})
			delete(want, p)
		}
		f.Close()
	}
	if len(want) > 0 {
		return nil, fmt.Errorf("lazy image: files read at start in no layer: %v", want)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	return spans, nil
}

// lazyFloor is the least the container's start can cost from reg: the
// manifest and the config, then only the compressed bytes of what it
// reads (each file's chunks as one range request, all files at once),
// into nothing: no TOC, no decompression, no container.
func lazyFloor(li *LazyImage, reg *ShapedRegistry, ref string, readBytes int64, bounds string) *Floor {
	var spans []blobSpan
	var total int64
	return &Floor{
		Name:   "manifest + config + the compressed chunks read, one range per file, in parallel",
		Bounds: bounds,
		Setup: func(ctx context.Context) (any, error) {
			var err error
			if spans, err = lazySpans(li, readBytes); err != nil {
				return nil, err
			}
			for _, s := range spans {
				total += s.end - s.start
			}
			return nil, nil
		},
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			host, repoTag, _ := strings.Cut(ref, "/")
			repo, tag, _ := strings.Cut(repoTag, ":")
			cfg, err := li.Image.ConfigName()
			if err != nil {
				return 0, err
			}
			get := func(path string, start, end int64) error {
				return getDiscard(ctx, client, "http://"+host+"/v2/"+repo+path, path, start, end)
			}
			start := time.Now()
			if err := get("/manifests/"+tag, 0, 0); err != nil {
				return 0, err
			}
			if err := get("/blobs/"+cfg.String(), 0, 0); err != nil {
				return 0, err
			}
			var g errgroup.Group
			for _, s := range spans {
				g.Go(func() error { return get("/blobs/"+s.digest, s.start, s.end) })
			}
			err = g.Wait()
			return time.Since(start), err
		},
	}
}

// lazyGoal is one goal of issue 36 and how this run did.
type lazyGoal struct {
	Goal     string  `json:"goal"`
	Ratio    float64 `json:"ratio"`
	Bound    float64 `json:"bound"`
	AtMost   bool    `json:"at_most"`
	Met      bool    `json:"met"`
	Measured bool    `json:"measured"`
}

// lazyGoals checks the goals against the run: p50s of the ready series
// (lazy endpoint against the reference and the floor) and of the second
// reads (lazy against the full pull's overlayfs), by endpoint name.
func lazyGoals(cmp *Comparison, ready string, reads []Throughput, lazy, full, ref string) []lazyGoal {
	p50 := func(s []time.Duration) float64 { return Series{Samples: s}.Summary().P50ms }
	ratioGoal := func(goal string, a, b, bound float64, atMost bool) lazyGoal {
		g := lazyGoal{Goal: goal, Bound: bound, AtMost: atMost}
		if a > 0 && b > 0 {
			g.Measured, g.Ratio = true, a/b
			g.Met = (atMost && g.Ratio <= bound) || (!atMost && g.Ratio >= bound)
		}
		return g
	}
	var floor float64
	if f := cmp.Floors["lazy pull: "+ready]; f != nil {
		floor = p50(f.Samples)
	}
	lazyReady := p50(cmp.Series["lazy pull: "+ready][lazy])
	rate := func(name string) float64 {
		for _, t := range reads {
			if t.Name == name {
				return t.Summary().P50MBps
			}
		}
		return 0
	}
	refLabel := ref
	if refLabel == "" {
		refLabel = "the reference runtime"
	}
	return []lazyGoal{
		ratioGoal(fmt.Sprintf("ready: %s ≤ %.1f× %s's full pull", lazy, lazyGoalVsReference, refLabel),
			lazyReady, p50(cmp.Series["lazy pull: "+ready][ref]), lazyGoalVsReference, true),
		ratioGoal(fmt.Sprintf("ready: %s ≤ %.0f× the floor", lazy, lazyGoalVsFloor), lazyReady, floor, lazyGoalVsFloor, true),
		ratioGoal(fmt.Sprintf("read again, image whole: %s (FUSE) ≥ %.1f× %s (overlayfs) MB/s", lazy, lazyGoalRead, full),
			rate(lazy+": read again"), rate(full+": read again"), lazyGoalRead, false),
		ratioGoal(fmt.Sprintf("first read, image whole: %s (FUSE) ≥ %.1f× %s (overlayfs) MB/s", lazy, lazyGoalRead, full),
			rate(lazy+": first read of the weights, image whole"), rate(full+": first read of the weights, image whole"), lazyGoalRead, false),
	}
}

// writeLazyGoals prints the goals as a markdown table to w and, when dir
// is set, as goals.json there.
func writeLazyGoals(w io.Writer, dir string, goals []lazyGoal) error {
	var b strings.Builder
	b.WriteString("\n### lazy pull: goals (issue 36)\n\n| goal | this run | met |\n|---|---:|---|\n")
	for _, g := range goals {
		switch {
		case !g.Measured:
			fmt.Fprintf(&b, "| %s | — | not measured in this run |\n", g.Goal)
		case g.Met:
			fmt.Fprintf(&b, "| %s | %.3g× | yes |\n", g.Goal, g.Ratio)
		default:
			fmt.Fprintf(&b, "| %s | %.3g× | **no** |\n", g.Goal, g.Ratio)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if dir == "" {
		return nil
	}
	data, err := json.MarshalIndent(goals, "", "  ")
	if err != nil {
		return err
	}
	return errors.Join(os.WriteFile(filepath.Join(dir, "goals.json"), data, 0o644),
		os.WriteFile(filepath.Join(dir, "goals.md"), []byte(b.String()), 0o644))
}
