package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// One pod with a CPU burner, a 70 MiB memory holder and a file writer:
// CPU rate, working set, writable layer, the pod's own stats, list filters
// and NotFound, all on the real daemon and real cgroups.
func TestStatsContainersAndPod(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)

	burner := e.run(e.config("burner", "sh", "-c", "while :; do :; done"))
	// 70 MiB of tmpfs pages (two 64 MiB tmpfs mounts: /dev/shm and /dev),
	// charged to the writer's memory cgroup and held while it sleeps.
	memCfg := e.config("mem", "sh", "-c",
		"head -c 41943040 /dev/zero > /dev/shm/x && head -c 31457280 /dev/zero > /dev/y && touch /dev/shm/done && sleep 1000")
	memCfg.Labels["role"] = "mem"
	memCfg.Linux.Resources = &criapi.LinuxContainerResources{MemoryLimitInBytes: 256 << 20}
	mem := e.run(memCfg)
	// Writes 8 MiB into its writable layer a few seconds after it starts.
	writer := e.run(e.config("writer", "sh", "-c", "sleep 4; head -c 8388608 /dev/zero > /big; sleep 1000"))
	before := containerStats(t, e.d, writer).GetWritableLayer()

	// CPU: the first sample has no rate; each later one has the rate since
	// the one before. Sampled until the loop has run 300 ms of CPU,
	// however long a loaded machine (the TCG guest beside other work)
	// makes that take: what the machine lends the loop is not what this
	// test is about; that the rate is the counters' is.
	first := containerStats(t, e.d, burner)
	if first.GetAttributes().GetId() != burner || first.GetAttributes().GetMetadata().GetName() != "burner" {
		t.Fatalf("attributes %+v", first.GetAttributes())
	}
	cum := func(s *criapi.ContainerStats) uint64 { return s.GetCpu().GetUsageCoreNanoSeconds().GetValue() }
	prev, second := first, first
	for cum(second)-cum(first) < uint64(300*time.Millisecond) {
		if ctx.Err() != nil {
			t.Fatalf("the busy loop did not run 300 ms of CPU: %v then %v", first.GetCpu(), second.GetCpu())
		}
		time.Sleep(500 * time.Millisecond)
		prev, second = second, containerStats(t, e.d, burner)
	}
	nc := second.GetCpu().GetUsageNanoCores().GetValue()
	t.Logf("busy loop: %d nano-cores", nc)
	want := float64(cum(second)-cum(prev)) / float64(second.GetCpu().GetTimestamp()-prev.GetCpu().GetTimestamp()) * 1e9
	if nc == 0 || float64(nc) < want*0.98 || float64(nc) > want*1.02 || nc > uint64(runtime.NumCPU())*11e8 {
		t.Fatalf("busy loop: usage_nano_cores %d, want %.0f from the cumulative usage and timestamps", nc, want)
	}
	if second.GetCpu().GetUsageCoreNanoSeconds().GetValue() <= first.GetCpu().GetUsageCoreNanoSeconds().GetValue() {
		t.Fatalf("cumulative CPU did not grow: %v then %v", first.GetCpu(), second.GetCpu())
	}
	if second.GetCpu().GetTimestamp() <= first.GetCpu().GetTimestamp() {
		t.Fatal("timestamps do not advance")
	}

	// Memory: working set above 64 MiB once the writes are done, with the
	// limit's headroom as available bytes.
	// The writes first, bounded by ctx: slow machines, such as the TCG
	// guest of the cgroup v2 lane, can take longer than waitUntil's bound.
	for {
		r, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: mem, Cmd: []string{"test", "-e", "/dev/shm/done"}, Timeout: 10})
		if err != nil {
			t.Fatalf("wait for the memory holder's writes: %v", err)
		}
		if r.ExitCode == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var ms *criapi.ContainerStats
	waitUntil(t, "a working set above 64 MiB", func() bool {
		ms = containerStats(t, e.d, mem)
		return ms.GetMemory().GetWorkingSetBytes().GetValue() > 64<<20
	})
	m := ms.GetMemory()
	t.Logf("70 MiB holder: working set %d, usage %d, rss %d", m.GetWorkingSetBytes().GetValue(), m.GetUsageBytes().GetValue(), m.GetRssBytes().GetValue())
	if m.GetUsageBytes().GetValue() < m.GetWorkingSetBytes().GetValue() {
		t.Fatalf("usage %d below working set %d", m.GetUsageBytes().GetValue(), m.GetWorkingSetBytes().GetValue())
	}
	if avail := m.GetAvailableBytes().GetValue(); avail == 0 || avail > 256<<20-64<<20 {
		t.Fatalf("available bytes %d with a 256 MiB limit", avail)
	}
	if m.GetPageFaults().GetValue() == 0 {
		t.Fatal("no page faults counted")
	}

	// Writable layer: grows by what the container writes.
	if before.GetFsId().GetMountpoint() == "" || before.GetInodesUsed().GetValue() == 0 || before.GetUsedBytes().GetValue() >= 8<<20 {
		t.Fatalf("writable layer before the write %+v", before)
	}
	waitUntil(t, "the writable layer to grow by the write", func() bool {
		after := containerStats(t, e.d, writer).GetWritableLayer()
		return after.GetUsedBytes().GetValue() >= before.GetUsedBytes().GetValue()+8<<20 &&
			after.GetInodesUsed().GetValue() > before.GetInodesUsed().GetValue()
	})

	// The pod: its cgroup holds every container, so it sees the burner's
	// CPU and the holder's memory, and counts their processes.
	podStats(t, e.d, e.pod)
	time.Sleep(time.Second)
	ps := podStats(t, e.d, e.pod)
	if ps.GetAttributes().GetId() != e.pod || ps.GetAttributes().GetMetadata().GetName() != e.podCfg.Metadata.Name || ps.GetAttributes().GetLabels()["app"] == "" {
		t.Fatalf("pod attributes %+v", ps.GetAttributes())
	}
	pl := ps.GetLinux()
	if pl.GetCpu().GetUsageNanoCores().GetValue() == 0 {
		t.Fatalf("pod usage_nano_cores %d with a busy container", pl.GetCpu().GetUsageNanoCores().GetValue())
	}
	if pl.GetMemory().GetWorkingSetBytes().GetValue() < 64<<20 {
		t.Fatalf("pod working set %d", pl.GetMemory().GetWorkingSetBytes().GetValue())
	}
	if n := pl.GetProcess().GetProcessCount().GetValue(); n < 3 {
		t.Fatalf("pod process count %d, want ≥3", n)
	}
	if len(pl.GetContainers()) < 3 {
		t.Fatalf("pod stats list %d containers", len(pl.GetContainers()))
	}
	if pl.GetNetwork().GetDefaultInterface().GetName() != "eth0" {
		t.Fatalf("pod network %+v", pl.GetNetwork())
	}

	// Filters.
	list := func(f *criapi.ContainerStatsFilter) []string {
		resp, err := e.d.Runtime.ListContainerStats(ctx, &criapi.ListContainerStatsRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range resp.Stats {
			ids = append(ids, s.GetAttributes().GetId())
		}
		return ids
	}
	if ids := list(nil); len(ids) < 3 {
		t.Fatalf("unfiltered list %v", ids)
	}
	if ids := list(&criapi.ContainerStatsFilter{Id: burner}); len(ids) != 1 || ids[0] != burner {
		t.Fatalf("by id %v", ids)
	}
	if ids := list(&criapi.ContainerStatsFilter{LabelSelector: map[string]string{"role": "mem"}}); len(ids) != 1 || ids[0] != mem {
		t.Fatalf("by label %v", ids)
	}
	if ids := list(&criapi.ContainerStatsFilter{PodSandboxId: "nonexistent"}); len(ids) != 0 {
		t.Fatalf("by other pod %v", ids)
	}
	if ids := list(&criapi.ContainerStatsFilter{PodSandboxId: e.pod}); len(ids) < 3 {
		t.Fatalf("by pod %v", ids)
	}
	podList, err := e.d.Runtime.ListPodSandboxStats(ctx, &criapi.ListPodSandboxStatsRequest{Filter: &criapi.PodSandboxStatsFilter{LabelSelector: map[string]string{"app": e.podCfg.Labels["app"]}}})
	if err != nil || len(podList.Stats) != 1 || podList.Stats[0].GetAttributes().GetId() != e.pod {
		t.Fatalf("ListPodSandboxStats by label: %v, %v", podList, err)
	}
	podList, err = e.d.Runtime.ListPodSandboxStats(ctx, &criapi.ListPodSandboxStatsRequest{Filter: &criapi.PodSandboxStatsFilter{Id: "nonexistent"}})
	if err != nil || len(podList.Stats) != 0 {
		t.Fatalf("ListPodSandboxStats by unknown id: %v, %v", podList, err)
	}

	// Unknown IDs.
	_, err = e.d.Runtime.ContainerStats(ctx, &criapi.ContainerStatsRequest{ContainerId: "nonexistent"})
	berthdtest.WantCode(t, err, codes.NotFound)
	_, err = e.d.Runtime.PodSandboxStats(ctx, &criapi.PodSandboxStatsRequest{PodSandboxId: "nonexistent"})
	berthdtest.WantCode(t, err, codes.NotFound)

	// An exited container still reports its writable layer.
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: burner}); err != nil {
		t.Fatal(err)
	}
	if st := containerStats(t, e.d, burner); st.GetWritableLayer() == nil || st.GetAttributes().GetId() != burner {
		t.Fatalf("exited container stats %+v", st)
	}
	stopRemove(t, e.d, e.pod)
}

// Traffic from the host into a listener in the pod shows up in the pod's
// network stats and its cAdvisor network metrics.
func TestStatsPodNetworkGrowsWithTraffic(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("netstats")
	id := runPod(t, d, cfg)
	st, info := podStatus(t, d, id)
	serveInNetns(t, info.NetNSPath, 8080)

	before := podStats(t, d, id).GetLinux().GetNetwork().GetDefaultInterface()
	if before.GetName() != "eth0" {
		t.Fatalf("default interface %+v", before)
	}
	for i := 0; i < 20; i++ {
		if err := dialHello(net.JoinHostPort(st.GetNetwork().GetIp(), "8080")); err != nil {
			t.Fatal(err)
		}
	}
	after := podStats(t, d, id).GetLinux().GetNetwork().GetDefaultInterface()
	// 20 connections: each at least a SYN and an ACK in, "hello" out.
	if after.GetRxBytes().GetValue() < before.GetRxBytes().GetValue()+20*100 ||
		after.GetTxBytes().GetValue() < before.GetTxBytes().GetValue()+20*15 {
		t.Fatalf("network counters did not grow: before %+v after %+v", before, after)
	}

	resp, err := d.Runtime.ListPodSandboxMetrics(berthdtest.Ctx(t), &criapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, pm := range resp.PodMetrics {
		if pm.PodSandboxId != id {
			continue
		}
		for _, m := range pm.Metrics {
			if m.Name == "container_network_receive_packets_total" && m.Value.GetValue() < 40 {
				t.Fatalf("rx packets after 20 connections: %+v", m)
			}
			if m.Name == "container_network_transmit_packets_total" && m.Value.GetValue() < 20 {
				t.Fatalf("tx packets after 20 connections: %+v", m)
			}
			if m.Name == "container_network_receive_bytes_total" {
				want := []string{"netstats", "default", "", id, "", "eth0"}
				if strings.Join(m.LabelValues, ",") != strings.Join(want, ",") || m.Value.GetValue() < after.GetRxBytes().GetValue() || m.MetricType != criapi.MetricType_COUNTER {
					t.Fatalf("rx metric %+v", m)
				}
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no pod network metric for %s in %+v", id, resp.PodMetrics)
	}
	stopRemove(t, d, id)
}

// expectedCadvisorMetrics are the cAdvisor metrics critest's metrics specs
// expect from a runtime (less the ones it lists as unimplemented
// everywhere).
var expectedCadvisorMetrics = []string{
	"container_blkio_device_usage_total", "container_cpu_cfs_periods_total", "container_cpu_cfs_throttled_periods_total",
	"container_cpu_cfs_throttled_seconds_total", "container_cpu_system_seconds_total", "container_cpu_usage_seconds_total",
	"container_cpu_user_seconds_total", "container_file_descriptors", "container_fs_inodes_free", "container_fs_inodes_total",
	"container_fs_limit_bytes", "container_fs_reads_bytes_total", "container_fs_reads_total", "container_fs_usage_bytes",
	"container_fs_writes_bytes_total", "container_fs_writes_total", "container_last_seen", "container_memory_cache",
	"container_memory_failcnt", "container_memory_failures_total", "container_memory_kernel_usage", "container_memory_mapped_file",
	"container_memory_max_usage_bytes", "container_memory_rss", "container_memory_swap", "container_memory_usage_bytes",
	"container_memory_working_set_bytes", "container_network_receive_bytes_total", "container_network_receive_errors_total",
	"container_network_receive_packets_dropped_total", "container_network_receive_packets_total",
	"container_network_transmit_bytes_total", "container_network_transmit_errors_total",
	"container_network_transmit_packets_dropped_total", "container_network_transmit_packets_total", "container_oom_events_total",
	"container_processes", "container_sockets", "container_spec_cpu_period", "container_spec_cpu_shares",
	"container_spec_memory_limit_bytes", "container_spec_memory_swap_limit_bytes", "container_start_time_seconds",
	"container_threads", "container_threads_max",
}

// enableBlkioAccounting sets a no-op write limit (10 GB/s) on the block
// device under dir in container id's v1 blkio cgroup: recent kernels (seen
// on 6.18) only count a v1 cgroup's I/O on a device once a throttle limit
// is set on it. berthd never sets one, so without this the block I/O
// metrics are absent, as critest allows.
func enableBlkioAccounting(t *testing.T, id, dir string) {
	t.Helper()
	if cgroupV2() {
		return // v2's io.stat counts without a limit
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	var cg string
	filepath.WalkDir("/sys/fs/cgroup/blkio", func(p string, de os.DirEntry, err error) error {
		if err == nil && de.IsDir() && strings.HasSuffix(de.Name(), id) {
			cg = p
			return filepath.SkipAll
		}
		return nil
	})
	if cg == "" {
		t.Skip("no v1 blkio cgroup for the container")
	}
	limit := fmt.Sprintf("%d:%d 10000000000", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(filepath.Join(cg, "blkio.throttle.write_bps_device"), []byte(limit), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, "blkio.throttle.read_bps_device"), []byte(limit), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ListMetricDescriptors names what ListPodSandboxMetrics sends, with
// cAdvisor's label keys; a busy, CPU-throttled container that does direct
// block I/O and holds a listening socket shows every expected metric in
// both RPCs, each with its descriptor's label count and a sane value.
func TestStatsMetricDescriptorsAndContainerMetrics(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx := berthdtest.Ctx(t)
	descs, err := e.d.Runtime.ListMetricDescriptors(ctx, &criapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for _, d := range descs.Descriptors {
		if _, dup := keys[d.Name]; dup {
			t.Errorf("descriptor %s listed twice", d.Name)
		}
		keys[d.Name] = len(d.LabelKeys)
		if d.Help == "" || strings.Join(d.LabelKeys[:5], ",") != "pod,namespace,container,id,image" {
			t.Fatalf("%s help %q label keys %v", d.Name, d.Help, d.LabelKeys)
		}
	}
	for _, name := range expectedCadvisorMetrics {
		if _, ok := keys[name]; !ok {
			t.Errorf("descriptor %s missing", name)
		}
	}

	// Half a core of quota for a busy loop: throttled every period. The
	// direct I/O waits for /go (see enableBlkioAccounting).
	cfg := e.config("app", "sh", "-c",
		"nc -l -p 8081 & while [ ! -e /go ]; do sleep 0.1; done; dd if=/dev/zero of=/direct bs=4096 count=256 oflag=direct && dd if=/direct of=/dev/null bs=4096 iflag=direct && while :; do :; done")
	cfg.Linux.Resources = &criapi.LinuxContainerResources{
		MemoryLimitInBytes: 100 << 20, MemorySwapLimitInBytes: 200 << 20,
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512,
	}
	id := e.run(cfg)
	enableBlkioAccounting(t, id, e.d.Dir)
	if _, err := e.d.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"touch", "/go"}, Timeout: 10}); err != nil {
		t.Fatal(err)
	}

	// CPU seconds are whole seconds: wait for user+system to reach one,
	// and for the direct I/O to be done.
	var podLevel, got map[string][]*criapi.Metric
	val := func(name string) uint64 {
		t.Helper()
		if len(got[name]) == 0 {
			t.Fatalf("metric %s missing", name)
		}
		return got[name][0].GetValue().GetValue()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		podLevel, got = podMetricsOf(t, e.d, e.pod, id)
		if val("container_cpu_user_seconds_total")+val("container_cpu_system_seconds_total") > 0 && len(got["container_fs_reads_bytes_total"]) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}

	for _, name := range expectedCadvisorMetrics {
		ms := append(append([]*criapi.Metric(nil), got[name]...), podLevel[name]...)
		if len(ms) == 0 {
			t.Errorf("metric %s not sent", name)
		}
		for _, m := range ms {
			if n := keys[m.Name]; n != len(m.LabelValues) {
				t.Errorf("metric %s has %d label values, its descriptor %d keys", m.Name, len(m.LabelValues), n)
			}
			if m.Timestamp == 0 || m.Value == nil {
				t.Errorf("metric %s: timestamp %d value %v", m.Name, m.Timestamp, m.Value)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	lim := got["container_spec_memory_limit_bytes"][0]
	if lim.Value.GetValue() != 100<<20 || lim.LabelValues[2] != "app" || lim.LabelValues[3] != id || lim.LabelValues[4] != e.reg.Ref("busybox:latest") {
		t.Fatalf("memory limit metric %+v", lim)
	}
	for name, want := range map[string]uint64{
		"container_spec_cpu_period": 100000, "container_spec_cpu_shares": 512, "container_spec_memory_swap_limit_bytes": 200 << 20,
		"container_oom_events_total": 0,
	} {
		if v := val(name); v != want {
			t.Errorf("%s = %d, want %d", name, v, want)
		}
	}
	cpu, user, sys := val("container_cpu_usage_seconds_total"), val("container_cpu_user_seconds_total"), val("container_cpu_system_seconds_total")
	if user+sys == 0 || user+sys > cpu+2 {
		t.Errorf("cpu usage %d s, user %d s, system %d s", cpu, user, sys)
	}
	periods, throttled := val("container_cpu_cfs_periods_total"), val("container_cpu_cfs_throttled_periods_total")
	if periods == 0 || throttled == 0 || throttled > periods {
		t.Errorf("cfs periods %d, throttled %d, for a busy loop at half a core", periods, throttled)
	}
	// sh, nc and the busy loop's shell; nc's listening socket.
	if val("container_processes") < 2 || val("container_threads") < val("container_processes") ||
		val("container_file_descriptors") < 3 || val("container_sockets") < 1 {
		t.Errorf("processes %d threads %d fds %d sockets %d", val("container_processes"), val("container_threads"),
			val("container_file_descriptors"), val("container_sockets"))
	}
	ws, usage, peak := val("container_memory_working_set_bytes"), val("container_memory_usage_bytes"), val("container_memory_max_usage_bytes")
	if ws == 0 || usage < ws || peak < usage || val("container_memory_rss") == 0 {
		t.Errorf("memory: working set %d usage %d peak %d rss %d", ws, usage, peak, val("container_memory_rss"))
	}
	faults := map[string]uint64{}
	for _, m := range got["container_memory_failures_total"] {
		faults[m.LabelValues[5]+"/"+m.LabelValues[6]] = m.Value.GetValue()
	}
	if len(faults) != 4 || faults["pgfault/container"] == 0 || faults["pgfault/hierarchy"] < faults["pgfault/container"] {
		t.Errorf("memory failures %v", faults)
	}
	fsLimit, fsUsed := val("container_fs_limit_bytes"), val("container_fs_usage_bytes")
	if fsUsed < 1<<20 || fsLimit < fsUsed || val("container_fs_inodes_total") < val("container_fs_inodes_free") || val("container_fs_inodes_free") == 0 {
		t.Errorf("fs: limit %d used %d inodes %d free %d", fsLimit, fsUsed, val("container_fs_inodes_total"), val("container_fs_inodes_free"))
	}
	// 1 MiB written and read back with O_DIRECT reaches the block device
	// from the container's own cgroup.
	var wrote, read uint64
	for _, m := range got["container_fs_writes_bytes_total"] {
		wrote += m.Value.GetValue()
	}
	for _, m := range got["container_fs_reads_bytes_total"] {
		read += m.Value.GetValue()
	}
	if wrote < 1<<20 || read < 1<<20 || val("container_fs_writes_total") == 0 {
		t.Errorf("block I/O: wrote %d read %d bytes", wrote, read)
	}
	for _, m := range got["container_blkio_device_usage_total"] {
		if op := m.LabelValues[8]; op != "Read" && op != "Write" {
			t.Errorf("blkio operation %q", op)
		}
	}
	for _, m := range podLevel["container_network_receive_packets_total"] {
		if m.LabelValues[2] != "" || m.LabelValues[3] != e.pod || m.LabelValues[5] == "" {
			t.Errorf("pod network labels %v", m.LabelValues)
		}
	}
	stopRemove(t, e.d, e.pod)
}

// A full lifecycle reaches two subscribers in order, each event with the
// pod's status and its containers' statuses; an exit on its own is
// reported without anyone asking; a subscriber that never reads stalls
// nothing.
func TestContainerEventsLifecycleInOrder(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	subscribe := func() criapi.RuntimeService_GetContainerEventsClient {
		s, err := e.d.Runtime.GetContainerEvents(ctx, &criapi.GetEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	stalled := subscribe() // never read
	_ = stalled
	a, b := subscribe(), subscribe()
	// Subscriptions register when the server handler runs: wait for that.
	time.Sleep(300 * time.Millisecond)

	// Exits on its own after a moment: STOPPED must come from the exit
	// itself, with no CRI call looking at the container meanwhile.
	id := e.run(e.config("short", "sh", "-c", "sleep 1; exit 3"))
	early := map[string][]*criapi.ContainerEventResponse{"a": recvEvents(t, a, 3), "b": recvEvents(t, b, 3)}
	if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	want := []criapi.ContainerEventType{
		criapi.ContainerEventType_CONTAINER_CREATED_EVENT,
		criapi.ContainerEventType_CONTAINER_STARTED_EVENT,
		criapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		criapi.ContainerEventType_CONTAINER_DELETED_EVENT,
	}
	for name, s := range map[string]criapi.RuntimeService_GetContainerEventsClient{"a": a, "b": b} {
		evs := append(early[name], recvEvents(t, s, 1)...)
		for i, ev := range evs {
			if ev.ContainerEventType != want[i] || ev.ContainerId != id {
				t.Fatalf("subscriber %s event %d: %v for %s, want %v for %s", name, i, ev.ContainerEventType, ev.ContainerId, want[i], id)
			}
			if ev.PodSandboxStatus.GetId() != e.pod || ev.PodSandboxStatus.GetState() != criapi.PodSandboxState_SANDBOX_READY {
				t.Fatalf("event %d pod status %+v", i, ev.PodSandboxStatus)
			}
			if ev.CreatedAt == 0 || (i > 0 && ev.CreatedAt < evs[i-1].CreatedAt) {
				t.Fatalf("event %d timestamp %d", i, ev.CreatedAt)
			}
		}
		stopped := evs[2].ContainersStatuses
		if len(stopped) != 1 || stopped[0].Id != id || stopped[0].State != criapi.ContainerState_CONTAINER_EXITED || stopped[0].ExitCode != 3 {
			t.Fatalf("stopped event statuses %+v", stopped)
		}
		if len(evs[3].ContainersStatuses) != 0 {
			t.Fatalf("deleted event still lists %+v", evs[3].ContainersStatuses)
		}
		if evs[1].ContainersStatuses[0].State != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("started event status %+v", evs[1].ContainersStatuses)
		}
	}

	// Two containers: each event lists both; StopContainer sends STOPPED once.
	c1 := e.run(e.config("one", "sleep", "1000"))
	c2 := e.create(e.config("two", "sleep", "1000"))
	evs := recvEvents(t, a, 3)
	if evs[2].ContainerId != c2 || len(evs[2].ContainersStatuses) != 2 {
		t.Fatalf("created event of the second container: %+v", evs[2])
	}
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: c1, Timeout: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: c1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: c2}); err != nil {
		t.Fatal(err)
	}
	evs = recvEvents(t, a, 2)
	if evs[0].ContainerId != c1 || evs[0].ContainerEventType != criapi.ContainerEventType_CONTAINER_STOPPED_EVENT ||
		evs[1].ContainerId != c2 || evs[1].ContainerEventType != criapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		t.Fatalf("after stop, stop, remove: %v %s, %v %s", evs[0].ContainerEventType, evs[0].ContainerId, evs[1].ContainerEventType, evs[1].ContainerId)
	}

	// Removing a running container: it stops, then it is deleted.
	c3 := e.run(e.config("three", "sleep", "1000"))
	if _, err := e.d.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: c3}); err != nil {
		t.Fatal(err)
	}
	evs = recvEvents(t, a, 4)
	for i, want := range want {
		if evs[i].ContainerId != c3 || evs[i].ContainerEventType != want {
			t.Fatalf("running container removed: event %d is %v for %s, want %v", i, evs[i].ContainerEventType, evs[i].ContainerId, want)
		}
	}

	// The stalled subscriber has not slowed anything: more pods and
	// containers go through promptly.
	for i := 0; i < 5; i++ {
		start := time.Now()
		cfg := podConfig("more-" + strconv.Itoa(i))
		pod := runPod(t, e.d, cfg)
		resp, err := e.d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod, Config: e.config("c", "true"), SandboxConfig: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 20*time.Second {
			t.Fatalf("pod %d took %s with a stalled subscriber", i, took)
		}
		stopRemove(t, e.d, pod)
	}
	stopRemove(t, e.d, e.pod)
}

// /metrics counts pods and containers by state and shims, and image pull
// bytes, and still parses.
func TestMetricsCountObjectsAndPulls(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	pull(t, d, reg.Ref("busybox:latest"), nil)
	ctx := berthdtest.Ctx(t)
	cfg := podConfig("counted")
	pod := runPod(t, d, cfg)
	create := func(name string, args ...string) string {
		resp, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: &criapi.ContainerConfig{
			Metadata: &criapi.ContainerMetadata{Name: name}, Image: &criapi.ImageSpec{Image: reg.Ref("busybox:latest")}, Command: args,
			Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
				NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.ContainerId
	}
	running := create("running", "sleep", "1000")
	if _, err := d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: running}); err != nil {
		t.Fatal(err)
	}
	create("created", "true")
	st, err := d.Runtime.Status(ctx, &criapi.StatusRequest{Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() map[string]float64 { return scrapeMetrics(t, st.Info["metricsAddress"]) }
	got := scrape()
	for key, want := range map[string]float64{
		"berth_pods{state=ready}":           1,
		"berth_containers{state=running}":   1,
		"berth_containers{state=created}":   1,
		"berth_containers{state=exited}":    0,
		"berth_shims":                       1,
		"berth_image_pull_duration_seconds": 1,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v", key, got[key], want)
		}
	}
	if got["berth_image_pull_bytes_total"] < 1<<20 {
		t.Errorf("pull bytes %v, want at least busybox's size", got["berth_image_pull_bytes_total"])
	}
	stopRemove(t, d, pod)
	got = scrape()
	if got["berth_pods{state=ready}"] != 0 || got["berth_containers{state=running}"] != 0 || got["berth_shims"] != 0 {
		t.Errorf("after removing the pod: pods %v containers %v shims %v", got["berth_pods{state=ready}"], got["berth_containers{state=running}"], got["berth_shims"])
	}
}

// UpdatePodSandboxResources writes the new limits into the pod's cgroup,
// here under a kubelet-style cgroup parent; such a pod, and one on the
// host network, have pod stats too.
func TestUpdatePodSandboxResourcesSetsPodCgroup(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ctx := berthdtest.Ctx(t)
	cfg := podConfig("resized")
	cfg.Linux.CgroupParent = "/" + d.Config.CgroupParent + "/kubepods/burstable/pod-resized-uid"
	id := runPod(t, d, cfg)
	_, info := podStatus(t, d, id)
	if !strings.HasPrefix(info.CgroupParent, cfg.Linux.CgroupParent) {
		t.Fatalf("pod cgroup %s not under %s", info.CgroupParent, cfg.Linux.CgroupParent)
	}
	if ps := podStats(t, d, id); ps.GetLinux().GetMemory() == nil || ps.GetLinux().GetNetwork().GetDefaultInterface().GetName() != "eth0" {
		t.Fatalf("pod stats under a cgroup parent: %+v", ps.GetLinux())
	}
	hostCfg := podConfig("hostnet")
	hostCfg.Linux.SecurityContext.NamespaceOptions.Network = criapi.NamespaceMode_NODE
	host := runPod(t, d, hostCfg)
	if hs := podStats(t, d, host); hs.GetLinux().GetCpu() == nil || hs.GetLinux().GetMemory() == nil || hs.GetLinux().GetNetwork() != nil {
		t.Fatalf("host-network pod stats: %+v", hs.GetLinux())
	}
	stopRemove(t, d, host)
	_, err := d.Runtime.UpdatePodSandboxResources(ctx, &criapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: id,
		Resources:    &criapi.LinuxContainerResources{MemoryLimitInBytes: 300 << 20, CpuShares: 256, CpuQuota: 50000, CpuPeriod: 100000},
	})
	if err != nil {
		t.Fatal(err)
	}
	read := func(ctrl, file string) string {
		data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctrl, info.CgroupParent, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	if cgroupV2() {
		// The v2 files, converted as runc converts a container's: shares
		// 256 is weight 10.
		for file, want := range map[string]string{"memory.max": strconv.Itoa(300 << 20), "cpu.weight": "10", "cpu.max": "50000 100000"} {
			if got := read("", file); got != want {
				t.Fatalf("pod %s = %s, want %s", file, got, want)
			}
		}
		// No quota is "max"; the unified map (MemoryQoS's memory.high) lands.
		_, err = d.Runtime.UpdatePodSandboxResources(ctx, &criapi.UpdatePodSandboxResourcesRequest{
			PodSandboxId: id,
			Resources: &criapi.LinuxContainerResources{MemoryLimitInBytes: 300 << 20, CpuQuota: -1, CpuPeriod: 100000,
				Unified: map[string]string{"memory.high": strconv.Itoa(200 << 20)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		for file, want := range map[string]string{"memory.high": strconv.Itoa(200 << 20), "cpu.max": "max 100000"} {
			if got := read("", file); got != want {
				t.Fatalf("pod %s = %s, want %s", file, got, want)
			}
		}
	} else {
		if got := read("memory", "memory.limit_in_bytes"); got != strconv.Itoa(300<<20) {
			t.Fatalf("pod memory limit %s", got)
		}
		if got := read("cpu", "cpu.shares"); got != "256" {
			t.Fatalf("pod cpu shares %s", got)
		}
		if got := read("cpu", "cpu.cfs_quota_us"); got != "50000" {
			t.Fatalf("pod cpu quota %s", got)
		}
	}
	_, err = d.Runtime.UpdatePodSandboxResources(ctx, &criapi.UpdatePodSandboxResourcesRequest{PodSandboxId: "nonexistent", Resources: &criapi.LinuxContainerResources{}})
	berthdtest.WantCode(t, err, codes.NotFound)
	_, err = d.Runtime.UpdatePodSandboxResources(ctx, &criapi.UpdatePodSandboxResourcesRequest{})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	stopRemove(t, d, id)
}

// After a daemon restart, berthd again notices a running container's own
// exit as it happens.
func TestContainerEventsReportExitsAfterRestart(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("waiter", "sh", "-c", "read x; exit 5")
	cfg.Stdin, cfg.StdinOnce = true, true
	id := e.run(cfg)
	e.d.Restart()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := e.d.Runtime.GetContainerEvents(ctx, &criapi.GetEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	closeStdin(t, e.d, e.pod, id)
	ev := recvEvents(t, stream, 1)[0]
	if ev.ContainerId != id || ev.ContainerEventType != criapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		t.Fatalf("event %v for %s", ev.ContainerEventType, ev.ContainerId)
	}
	if len(ev.ContainersStatuses) != 1 || ev.ContainersStatuses[0].ExitCode != 5 {
		t.Fatalf("statuses %+v", ev.ContainersStatuses)
	}
	stopRemove(t, e.d, e.pod)
}
