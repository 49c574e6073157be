package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// containerBench is a container.Store on a private root with a busybox
// layer standing in for an image, next to the same runc for baselines.
type containerBench struct {
	b      *testing.B
	dir    string
	lower  string
	cgroup string
	runc   *oci.Runtime
	store  *container.Store
	shims  string
}

func newContainerBench(b *testing.B) *containerBench {
	berthdtest.RequireRoot(b)
	dir, err := os.MkdirTemp("", "berth-bench-")
	if err != nil {
		b.Fatal(err)
	}
	cb := &containerBench{b: b, dir: dir, lower: filepath.Join(dir, "layer"), cgroup: "berthbench-" + filepath.Base(dir)}
	b.Cleanup(cb.close)
	bundletest.WriteRootfs(b, cb.lower)
	cb.runc = oci.New("runc", filepath.Join(dir, "state", "runtime", "runc"), nil)
	cb.shims = filepath.Join(dir, "state", "shims")
	cb.store, err = container.Open(context.Background(), container.Options{
		Dir:        filepath.Join(dir, "root", "containers"),
		ShimDir:    cb.shims,
		ShimBinary: bundletest.ShimBinary(b),
		Runtimes:   map[string]*oci.Runtime{"runc": cb.runc},
		Images:     benchImage{lower: cb.lower},
	})
	if err != nil {
		b.Fatal(err)
	}
	return cb
}

// close kills and removes everything the bench made (idempotent).
func (cb *containerBench) close() {
	if err := berthdtest.CleanupNode(cb.dir, cb.cgroup); err != nil {
		cb.b.Errorf("cleanup: %v", err)
	}
}

// benchImage leases one busybox layer to every container.
type benchImage struct{ lower string }

func (i benchImage) Acquire(context.Context, string, string) (*image.Image, []string, error) {
	return &image.Image{ID: "sha256:bench"}, []string{i.lower}, nil
}
func (benchImage) Release(string) error      { return nil }
func (benchImage) Owners() ([]string, error) { return nil, nil }

// create runs the container store's create: prepare, spec, commit.
func (cb *containerBench) create(ctx context.Context, pod, name string, args []string) (*container.Container, error) {
	d, err := cb.store.Prepare(ctx, container.CreateRequest{
		PodID: pod, Runtime: "runc",
		Config:  &criapi.ContainerConfig{Metadata: &criapi.ContainerMetadata{Name: name}, Image: &criapi.ImageSpec{Image: "busybox"}},
		LogPath: filepath.Join(cb.dir, "logs", pod, name+".log"),
	})
	if err != nil {
		return nil, err
	}
	defer d.Discard(ctx)
	spec := bundletest.Spec(d.Rootfs.Path, cb.cgroup, d.ID, args)
	return d.Commit(ctx, spec, nil)
}

// BenchmarkContainerLifecycle measures the container store's create,
// start and stop+remove through the node's monitor, and `runc create` + `runc
// start` of the same kind of bundle in the same run.
func BenchmarkContainerLifecycle(b *testing.B) {
	cb := newContainerBench(b)
	ctx := context.Background()
	const n = 30
	// A container that keeps the pod on the node's monitor, as a pod's first
	// one would.
	keep, err := cb.create(ctx, "pod", "keep", []string{"sleep", "100000"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cb.store.Start(ctx, keep.ID); err != nil {
		b.Fatal(err)
	}
	firstCreate := Series{Name: "Create, pod's first container (starts the shim)"}
	create := Series{Name: "Create"}
	start := Series{Name: "Start"}
	stopRemove := Series{Name: "Stop+Remove"}
	runcCreate := Series{Name: "runc create"}
	runcStart := Series{Name: "runc create + runc start"}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c, err := cb.create(ctx, "pod", fmt.Sprintf("c%d", i), []string{"sleep", "100000"})
		if err != nil {
			b.Fatal(err)
		}
		create.Samples = append(create.Samples, time.Since(t0))
		t0 = time.Now()
		if _, err := cb.store.Start(ctx, c.ID); err != nil {
			b.Fatal(err)
		}
		start.Samples = append(start.Samples, time.Since(t0))
		t0 = time.Now()
		if err := cb.store.Stop(ctx, c.ID, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := cb.store.Remove(ctx, c.ID); err != nil {
			b.Fatal(err)
		}
		stopRemove.Samples = append(stopRemove.Samples, time.Since(t0))

		// A fresh pod each time: the shim launch is part of the cost.
		pod := fmt.Sprintf("first%d", i)
		t0 = time.Now()
		f, err := cb.create(ctx, pod, "c", []string{"sleep", "100000"})
		if err != nil {
			b.Fatal(err)
		}
		firstCreate.Samples = append(firstCreate.Samples, time.Since(t0))
		if _, err := cb.store.Remove(ctx, f.ID); err != nil {
			b.Fatal(err)
		}

		// The baseline: runc alone on an equivalent bundle.
		id := fmt.Sprintf("runc%d", i)
		bundle := filepath.Join(cb.dir, "bundles", id)
		if err := os.MkdirAll(bundle, 0o700); err != nil {
			b.Fatal(err)
		}
		spec := bundletest.Spec(cb.lower, cb.cgroup, id, []string{"sleep", "100000"})
		spec.Root.Readonly = true
		data, _ := json.Marshal(spec)
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		if err := cb.runc.CLI().Create(ctx, id, ocicli.CreateOpts{Bundle: bundle, PidFile: filepath.Join(bundle, "pid")}); err != nil {
			b.Fatal(err)
		}
		runcCreate.Samples = append(runcCreate.Samples, time.Since(t0))
		if err := cb.runc.CLI().Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		runcStart.Samples = append(runcStart.Samples, time.Since(t0))
		if err := cb.runc.Delete(ctx, id, true); err != nil {
			b.Fatal(err)
		}
	}
	if err := Report(os.Stdout, "container_lifecycle", firstCreate, create, start, stopRemove, runcCreate, runcStart); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkShimMemory reports berth-shim's PSS per pod: the node's keeper
// and monitor (decision 1701), which serve every pod, summed
// (smaps_rollup) and divided by the pods, for pods of 1 and 3 containers,
// alone and with 8, 48 and 110 (the kubelet's default maxPods) such pods
// at once: Pss_Anon is what the pods really cost (heap, stacks, runtime
// data), Pss_File the binary's pages. A third table gives the keeper and
// the monitor apart, whole (not divided by the pods): decision 3100 reads
// the one-pod node there.
// The last case has run 20 short-lived containers through the monitor
// first, so it has collected garbage at least once (a GC makes runtime
// metadata resident for good: decision 0303). A second table splits the
// memory by mapping (/proc/PID/smaps), which is where decisions 0303 and
// 1700 read what a Go shim is made of.
//
// Each case but the last then runs again under CRI-O's conmon, one per
// container as CRI-O runs it (conmonNode), with the same containers doing
// the same, and its PSS is summed over the case's conmons and divided by
// the pods the same way: issue 17's comparison, measured in the same run.
// Without conmon (or where it cannot run) those rows are skipped and the
// table says why. BENCH_WORKLOADS selects it as "shim memory".
func BenchmarkShimMemory(b *testing.B) {
	if !selected(os.Getenv("BENCH_WORKLOADS"), "shim memory") {
		b.Skip("not selected by BENCH_WORKLOADS")
	}
	type row struct {
		Case      string             `json:"case"`
		Pods      int                `json:"pods"`
		Churned   int                `json:"churned_containers,omitempty"`
		PerPod    int                `json:"containers_per_pod"`
		PssKiB    float64            `json:"pss_kib_per_pod"`
		AnonKiB   float64            `json:"pss_anon_kib_per_pod"`
		FileKiB   float64            `json:"pss_file_kib_per_pod"`
		RssKiB    float64            `json:"rss_kib_per_pod"`
		PerCtrKiB float64            `json:"pss_kib_per_container"`
		Threads   float64            `json:"threads_keeper_and_monitor"`
		Mappings  map[string]float64 `json:"pss_kib_per_pod_by_mapping"`
		// Processes is the keeper and the monitor apart, whole.
		Processes []shimProcess `json:"processes"`
		// Conmon is the same case under conmon, nil when skipped.
		Conmon *conmonRow `json:"conmon,omitempty"`
	}
	const settle = 3 * time.Second // let the monitors settle and trim
	conmonSkipped := conmonUnusable()
	var rows []row
	for _, tc := range []struct{ pods, perPod, churn int }{{1, 1, 0}, {1, 3, 0}, {8, 1, 0}, {8, 3, 0}, {48, 1, 0}, {48, 3, 0}, {110, 1, 0}, {110, 3, 0}, {1, 1, 20}} {
		cb := newContainerBench(b)
		ctx := context.Background()
		for p := 0; p < tc.pods; p++ {
			for c := 0; c < tc.perPod; c++ {
				ctr, err := cb.create(ctx, fmt.Sprintf("pod%d", p), fmt.Sprintf("c%d", c), workloadArgs(c))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := cb.store.Start(ctx, ctr.ID); err != nil {
					b.Fatal(err)
				}
			}
			// After the pod's containers, so that its shim (which exits with
			// its last container) serves them all.
			for i := 0; i < tc.churn; i++ {
				ctr, err := cb.create(ctx, fmt.Sprintf("pod%d", p), fmt.Sprintf("r%d", i), []string{"true"})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := cb.store.Start(ctx, ctr.ID); err != nil {
					b.Fatal(err)
				}
				if err := cb.store.Stop(ctx, ctr.ID, 0); err != nil {
					b.Fatal(err)
				}
				if _, err := cb.store.Remove(ctx, ctr.ID); err != nil {
					b.Fatal(err)
				}
			}
		}
		time.Sleep(settle)
		var pss, anon, file, rss, threads float64
		mappings := map[string]float64{}
		// The node's keeper and monitor serve every pod (decision 1701):
		// their memory, divided by the pods, is what a pod costs. Their
		// argv ends with the node dir (NUL-ended in cmdline).
		var procs []shimProcess
		for _, pid := range berthdtest.PidsMentioning(proto.NodeDir(cb.shims) + "\x00") {
			if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) != "berth-shim" {
				continue
			}
			m := smapsRollup(b, pid)
			pss += m["Pss"]
			anon += m["Pss_Anon"]
			file += m["Pss_File"]
			rss += m["Rss"]
			for k, v := range smapsByMapping(b, pid) {
				mappings[k] += v
			}
			p := shimProcess{Role: shimRole(pid), PssKiB: m["Pss"], AnonKiB: m["Pss_Anon"], FileKiB: m["Pss_File"], RssKiB: m["Rss"]}
			if task, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task"); err == nil {
				p.Threads = len(task)
				threads += float64(len(task))
			}
			procs = append(procs, p)
		}
		if len(procs) != 2 {
			b.Fatalf("found %d berth-shim processes for the node, want a keeper and a monitor", len(procs))
		}
		sort.Slice(procs, func(i, j int) bool { return procs[i].Role < procs[j].Role }) // keeper, monitor
		n := float64(tc.pods)
		name := fmt.Sprintf("%d pod(s) × %d container(s)", tc.pods, tc.perPod)
		if tc.churn > 0 {
			name += fmt.Sprintf(", after %d restarts", tc.churn)
		}
		for k := range mappings {
			mappings[k] /= n
		}
		r := row{
			Case: name, Pods: tc.pods, PerPod: tc.perPod, Churned: tc.churn,
			PssKiB: pss / n, AnonKiB: anon / n, FileKiB: file / n, RssKiB: rss / n, PerCtrKiB: pss / n / float64(tc.perPod),
			Threads: threads, Mappings: mappings, Processes: procs,
		}
		// Shims of one case must not share pages with the next case's.
		cb.close()

		// conmon has no churn case: a restarted container gets a new
		// conmon, the old one exits with its container.
		if conmonSkipped == "" && tc.churn == 0 {
			cr, err := measureConmon(b, tc.pods, tc.perPod, settle)
			if err != nil {
				conmonSkipped = err.Error()
				b.Logf("conmon rows skipped: %v", err)
			}
			r.Conmon = cr
		}
		rows = append(rows, r)
	}
	var sb strings.Builder
	sb.WriteString("\n### shim_memory (berth-shim, per pod)\n\n| case | PSS KiB | Pss_Anon KiB | Pss_File KiB | RSS KiB | PSS KiB per container | threads (keeper + monitor) |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f |\n", r.Case, r.PssKiB, r.AnonKiB, r.FileKiB, r.RssKiB, r.PerCtrKiB, r.Threads)
	}
	sb.WriteString("\n### shim_memory (conmon, one per container as CRI-O runs it, per pod)\n\n")
	if conmonSkipped != "" {
		fmt.Fprintf(&sb, "conmon rows skipped from here on: %s\n\n", conmonSkipped)
	}
	if rows[0].Conmon != nil { // conmon's rows end where it was skipped
		sb.WriteString("| case | PSS KiB | Pss_Anon KiB | Pss_File KiB | RSS KiB | PSS KiB per container | processes | threads | berth PSS ÷ conmon PSS |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for _, r := range rows {
		if c := r.Conmon; c != nil {
			fmt.Fprintf(&sb, "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d | %.2f |\n", r.Case, c.PssKiB, c.AnonKiB, c.FileKiB, c.RssKiB, c.PerCtrKiB, c.Processes, c.Threads, r.PssKiB/c.PssKiB)
		}
	}
	sb.WriteString("\nberth's keeper and monitor apart, KiB per process (not per pod):\n\n| case | keeper PSS | Pss_Anon | Pss_File | threads | monitor PSS | Pss_Anon | Pss_File | threads |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		sb.WriteString("| " + r.Case + " |")
		for _, p := range r.Processes {
			fmt.Fprintf(&sb, " %.0f | %.0f | %.0f | %d |", p.PssKiB, p.AnonKiB, p.FileKiB, p.Threads)
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\nberth's PSS KiB per pod by mapping (/proc/PID/smaps):\n\n| case |")
	for _, k := range smapsClasses {
		sb.WriteString(" " + k + " |")
	}
	sb.WriteString("\n|---|" + strings.Repeat("---:|", len(smapsClasses)) + "\n")
	for _, r := range rows {
		sb.WriteString("| " + r.Case + " |")
		for _, k := range smapsClasses {
			fmt.Fprintf(&sb, " %.0f |", r.Mappings[k])
		}
		sb.WriteString("\n")
	}
	fmt.Print(sb.String())
	if dir := os.Getenv("BENCH_OUT"); dir != "" {
		out := map[string]any{"benchmark": "shim_memory", "rows": rows, "time": time.Now().UTC()}
		if conmonSkipped != "" {
			out["conmon_skipped"] = conmonSkipped
		}
		data, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "shim_memory.json"), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// shimProcess is one of the node's berth-shim processes in a
// BenchmarkShimMemory case, whole.
type shimProcess struct {
	Role    string  `json:"role"` // keeper or monitor
	PssKiB  float64 `json:"pss_kib"`
	AnonKiB float64 `json:"pss_anon_kib"`
	FileKiB float64 `json:"pss_file_kib"`
	RssKiB  float64 `json:"rss_kib"`
	Threads int     `json:"threads"`
}

// shimRole is the mode pid's berth-shim runs in: its first argument.
func shimRole(pid int) string {
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	args := strings.Split(string(cmdline), "\x00")
	if len(args) < 2 {
		return "?"
	}
	return args[1]
}

// workloadArgs is what container c of a pod runs in the memory rows: the
// first logs a line a second, the rest sleep.
func workloadArgs(c int) []string {
	if c == 0 {
		return []string{"sh", "-c", "while true; do echo tick; sleep 1; done"}
	}
	return []string{"sleep", "100000"}
}

// smapsClasses are the columns of the per-mapping table, in the order a
// static Go binary maps them.
var smapsClasses = []string{"text+rodata", ".data", ".bss", "heap arena", "runtime metadata", "stack", "other"}

// smapsByMapping sums the Pss of pid's mappings by what they hold, for a
// static (CGO_ENABLED=0) Go binary: the binary's read-only pages (text,
// rodata: shared between shims), its written .data (copy-on-write, so
// private), the anonymous mapping right after it (.bss and .noptrbss), the
// heap arena (objects and every goroutine's and thread's stack), the
// runtime's other anonymous mappings (span and arena metadata, GC bitmaps,
// persistentalloc chunks) and the main thread's stack.
func smapsByMapping(b *testing.B, pid int) map[string]float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	class, prevBinary := "", false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping's header: range perms offset dev inode [path]
			lo, _, _ := strings.Cut(f[0], "-")
			addr, _ := strconv.ParseUint(lo, 16, 64)
			perms, path := f[1], ""
			if len(f) >= 6 {
				path = f[5]
			}
			isBinary := strings.HasSuffix(path, "/berth-shim")
			switch {
			case isBinary && strings.HasPrefix(perms, "rw"):
				class = ".data"
			case isBinary:
				class = "text+rodata"
			case path == "" && prevBinary:
				class = ".bss"
			case path == "" && addr < 0x7f0000000000:
				// Go places its heap arenas at hinted addresses (since
				// Go 1.26 at a random base) far below where the kernel
				// puts unhinted mappings (0x7f...), the runtime's
				// metadata among them.
				class = "heap arena"
			case path == "":
				class = "runtime metadata"
			case path == "[stack]":
				class = "stack"
			default:
				class = "other"
			}
			prevBinary = isBinary
			continue
		}
		if f[0] == "Pss:" && len(f) == 3 {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[class] += v
		}
	}
	return out
}

func smapsRollup(b *testing.B, pid int) map[string]float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == "kB" {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	return out
}
