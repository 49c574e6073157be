package integration

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/mounttest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestLazyPullMeasureMemory is a measurement, not a check (run it with
// BERTH_MEASURE_LAZY_MEMORY=1; docs/images.md has its numbers): the
// resident memory (VmRSS) of a node's berth-lazy, keeper and monitor
// with 0, 1, 4 and 16 lazy layers held, on a node with one pod. The
// layers are small eStargz images (the busybox base, then one of
// lazyLayerFiles each), pulled lazily by a real berthd, their
// background fetch held (they stay lazy), and then with it let go (the
// layers complete and their chunks are written out as files).
func TestLazyPullMeasureMemory(t *testing.T) {
	if os.Getenv("BERTH_MEASURE_LAZY_MEMORY") == "" {
		t.Skip("a measurement: set BERTH_MEASURE_LAZY_MEMORY=1")
	}
	reg := testimages.StartRegistry(t)
	base := testimages.EStargz(t, buildImage(t, nil), "bin/busybox")
	imgs := []string{}
	log := &rangeLog{}
	log.holdWhole(t)
	for i := range 15 {
		img := lazyImage(t)
		_, dg, _ := layerOf(t, img, 1)
		log.watch(t, reg, dg, nil)
		repo := fmt.Sprintf("lazy/mem%d:1", i)
		reg.Push(t, repo, img)
		imgs = append(imgs, reg.Ref(repo))
	}
	_, baseDigest, _ := layerOf(t, base, 0)
	log.watch(t, reg, baseDigest, nil)
	reg.Push(t, "lazy/membase:1", base)

	d, _, _ := lazyDaemon(t, berthdtest.Options{})
	e := lazyCtrEnv(t, d, reg, "lazy-mem")
	t.Cleanup(func() { stopRemove(t, d, e.pod) })
	report := func(layers int, state string) {
		if n := len(mounttest.FUSEBelow(t, d.Root)); n != layers {
			t.Fatalf("%d lazy mounts, want %d", n, layers)
		}
		lazyKiB := "not running"
		if pids := lazyServerPids(t, d); len(pids) == 1 {
			lazyKiB = strconv.Itoa(vmRSSKiB(t, pids[0]))
		} else if len(pids) > 1 {
			t.Fatalf("lazy-layer servers: %v", pids)
		}
		keeper, monitor := nodeShimPids(t, d)
		t.Logf("MEASURE layers=%d state=%s berth-lazy_kib=%s keeper_kib=%d monitor_kib=%d", layers, state, lazyKiB, vmRSSKiB(t, keeper), vmRSSKiB(t, monitor))
	}
	report(0, "none")
	pull(t, d, reg.Ref("lazy/membase:1"), nil)
	report(1, "lazy")
	for _, ref := range imgs[:3] {
		pull(t, d, ref, nil)
	}
	report(4, "lazy")
	for _, ref := range imgs[3:] {
		pull(t, d, ref, nil)
	}
	report(16, "lazy")
	// Read a file of every data layer once (a chunk on demand each).
	for _, ref := range imgs {
		if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
			t.Fatalf("%s: %q", ref, got)
		}
	}
	report(16, "lazy-read")
	log.release()
	lazyWait(t, func() bool { return strings.Count(lazyServerLog(t, d), "lazy layer files local") == 16 })
	report(16, "complete")
}

// vmRSSKiB is the VmRSS of pid, in KiB.
func vmRSSKiB(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// nodeShimPids are the keeper and the monitor of d's node.
func nodeShimPids(t *testing.T, d *berthdtest.Daemon) (keeper, monitor int) {
	t.Helper()
	var ks, ms []int
	for _, pid := range berthdtest.PidsMentioning(d.State) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.TrimSpace(string(comm)) != "berth-shim" {
			continue
		}
		switch {
		case strings.Contains(string(cmd), "\x00keeper\x00"):
			ks = append(ks, pid)
		case strings.Contains(string(cmd), "\x00monitor\x00"):
			ms = append(ms, pid)
		}
	}
	sort.Ints(ks)
	sort.Ints(ms)
	if len(ks) != 1 || len(ms) != 1 {
		t.Fatalf("keepers %v, monitors %v: want one each", ks, ms)
	}
	return ks[0], ms[0]
}
