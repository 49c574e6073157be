package stats

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/netnstest"
)

func TestGroupPathExpandsSystemdAndKeepsCgroupfs(t *testing.T) {
	for in, want := range map[string]string{
		"/berth/pod1/ctr1": "/berth/pod1/ctr1",
		"kubepods-besteffort-pod1234.slice:cri-berth:ctr1": "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-berth-ctr1.scope",
		"system.slice:berth:abc":                           "/system.slice/berth-abc.scope",
		"-.slice:berth:abc":                                "/berth-abc.scope",
	} {
		got, err := GroupPath(in)
		if err != nil || got != want {
			t.Errorf("GroupPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"relative/path", "a--b.slice:x:y", "noslice:x:y"} {
		if _, err := GroupPath(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("GroupPath(%q) error = %v, want InvalidArgument", bad, err)
		}
	}
}

func TestReadV2FromARealShapedFixtureTree(t *testing.T) {
	group, err := GroupPath("kubepods-besteffort-pod1234.slice:cri-berth:ctr1")
	if err != nil {
		t.Fatal(err)
	}
	u, err := ReadV2("testdata/cgroupv2", group)
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{
		CPUUsageNanos: 2500000 * 1000,
		MemoryUsage:   78643200,
		WorkingSet:    78643200 - 8388608,
		RSS:           67108864,
		PageFaults:    17000, MajorPageFaults: 12,
		MemoryLimit: 134217728,
		Processes:   3,

		CPUUserNanos: 2000000 * 1000, CPUSystemNanos: 500000 * 1000,
		CFSPeriods: 120, CFSThrottledPeriods: 7, CFSThrottledNanos: 350000 * 1000,
		MemoryCache: 10485760, MemoryMappedFile: 4096,
		MemoryKernel:   409600, // memory.stat "kernel", not the sum of its parts
		MemoryMaxUsage: 100663296, MemoryFailcnt: 3, OOMKills: 1,
		OwnPageFaults: 17000, OwnMajorPageFaults: 12,
		ThreadsMax: 1024,
		// No cgroup.procs in the fixture: nothing to count in /proc.
		IO: []DeviceIO{{Device: blockDevice(259, 99), Major: 259, Minor: 99, ReadBytes: 1048576, WriteBytes: 4194304, Reads: 16, Writes: 64}},
		// *.pressure totals are microseconds; PSI keeps nanoseconds.
		CPUPressure: &Pressure{
			Some: &PSI{TotalNanos: 4200000 * 1000, Avg10: 1.5, Avg60: 0.75, Avg300: 0.25},
			Full: &PSI{TotalNanos: 1300000 * 1000, Avg10: 0.5, Avg60: 0.2, Avg300: 0.05},
		},
		MemoryPressure: &Pressure{
			Some: &PSI{TotalNanos: 88000000 * 1000, Avg10: 12, Avg60: 6.1, Avg300: 2.02},
			Full: &PSI{TotalNanos: 71000000 * 1000, Avg10: 10.4, Avg60: 5, Avg300: 1.6},
		},
		IOPressure: &Pressure{Some: &PSI{TotalNanos: 9100 * 1000}, Full: &PSI{TotalNanos: 7000 * 1000}},
	}
	u.Timestamp = time.Time{}
	if !reflect.DeepEqual(*u, want) {
		t.Fatalf("usage\n got %+v\nwant %+v", *u, want)
	}
	if got := u.AvailableBytes(); got != 134217728-(78643200-8388608) {
		t.Fatalf("available = %d", got)
	}
	// The pod's cgroup has no limit: "max".
	pod, err := ReadV2("testdata/cgroupv2", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice")
	if err != nil {
		t.Fatal(err)
	}
	if pod.MemoryLimit != 0 || pod.AvailableBytes() != 0 || pod.Processes != 4 {
		t.Fatalf("unlimited pod cgroup: %+v", pod)
	}
	// Its fixture has no *.pressure files (a kernel with PSI off): absent,
	// not zero.
	if pod.CPUPressure != nil || pod.MemoryPressure != nil || pod.IOPressure != nil {
		t.Fatalf("pressure without *.pressure files: %+v %+v %+v", pod.CPUPressure, pod.MemoryPressure, pod.IOPressure)
	}
	if _, err := ReadV2("testdata/cgroupv2", "/absent"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing cgroup: %v, want NotFound", err)
	}
}

func TestCPURateComputesNanoCoresBetweenSamples(t *testing.T) {
	r := NewCPURate()
	t0 := time.Unix(100, 0)
	if got := r.NanoCores("c", t0, 1e9); got != 0 {
		t.Fatalf("first sample = %d, want 0", got)
	}
	if got := r.NanoCores("c", t0.Add(2*time.Second), 2e9); got != 5e8 {
		t.Fatalf("half a core = %d, want 5e8", got)
	}
	if got := r.NanoCores("c", t0.Add(3*time.Second), 1e9); got != 0 {
		t.Fatalf("counter reset = %d, want 0", got)
	}
}

func TestParseNetDevSkipsLoopback(t *testing.T) {
	data := []byte(`Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
  eth0:   52345     120    2    5    0     0          0         0    10234      80    1    4    0     0       0          0
`)
	ifs, err := parseNetDev(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0] != (Interface{Name: "eth0", RxBytes: 52345, RxPackets: 120, RxErrors: 2, RxDropped: 5, TxBytes: 10234, TxPackets: 80, TxErrors: 1, TxDropped: 4}) {
		t.Fatalf("interfaces %+v", ifs)
	}
}

func TestNetworkReadsInsideANamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pin := netnstest.New(t)
	ifs, err := Network(pin)
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 0 {
		t.Fatalf("a fresh namespace has only loopback, got %+v", ifs)
	}
}

func TestReadV1SeesAProcessBurningCPU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpuacct"); err != nil {
		t.Skip("no cgroup v1 cpuacct hierarchy here")
	}
	group := "/berth-stats-test-" + strconv.Itoa(os.Getpid())
	for _, ctrl := range []string{"cpuacct", "memory", "pids"} {
		dir := filepath.Join("/sys/fs/cgroup", ctrl, group)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(dir) })
	}
	// The shell joins the cgroups, then execs the busy loop so that its
	// memory is charged there (v1 does not move charges on migration).
	join := ""
	for _, ctrl := range []string{"cpuacct", "memory", "pids"} {
		join += "echo $$ > " + filepath.Join("/sys/fs/cgroup", ctrl, group, "cgroup.procs") + "; "
	}
	cmd := exec.Command("sh", "-c", join+`exec sh -c 'while :; do :; done'`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := NewCPURate()
	u1, err := ReadV1(group)
	if err != nil {
		t.Fatal(err)
	}
	r.NanoCores("x", u1.Timestamp, u1.CPUUsageNanos)
	// Wait until the loop has run 300 ms of CPU by its own account
	// (/proc), however long the machine makes that take: how much CPU a
	// loaded machine lends it is not what this test is about; that the
	// cgroup's counters see what the process ran is.
	ran := procCPU(t, cmd.Process.Pid)
	deadline := time.Now().Add(time.Minute)
	for procCPU(t, cmd.Process.Pid)-ran < 300*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("the busy loop did not run 300 ms of CPU in a minute")
		}
		time.Sleep(20 * time.Millisecond)
	}
	u2, err := ReadV1(group)
	if err != nil {
		t.Fatal(err)
	}
	nc := r.NanoCores("x", u2.Timestamp, u2.CPUUsageNanos)
	if grew := time.Duration(u2.CPUUsageNanos - u1.CPUUsageNanos); grew < 250*time.Millisecond { // /proc counts in 10 ms ticks
		t.Fatalf("cpuacct.usage grew %s while the loop ran at least 300 ms of CPU", grew)
	}
	want := float64(u2.CPUUsageNanos-u1.CPUUsageNanos) / float64(u2.Timestamp.Sub(u1.Timestamp).Nanoseconds()) * 1e9
	if nc == 0 || float64(nc) < want*0.99 || float64(nc) > want*1.01 || nc > uint64(runtime.NumCPU())*11e8 {
		t.Fatalf("nano-cores %d for a busy loop, want %.0f from the counters (at most %d cores)", nc, want, runtime.NumCPU())
	}
	if u2.Processes != 1 || u2.MemoryUsage == 0 {
		t.Fatalf("usage %+v", u2)
	}
	// The busy loop: user+system time, one thread, stdio open, a peak at
	// least the current usage.
	if u2.CPUUserNanos+u2.CPUSystemNanos == 0 || u2.Threads != 1 || u2.FileDescriptors < 3 || u2.MemoryMaxUsage < u2.MemoryUsage {
		t.Fatalf("detail %+v", u2)
	}
	if _, err := ReadV1("/berth-absent-cgroup"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing cgroup: %v, want NotFound", err)
	}
}

func TestDirUsageCountsHardLinksOnce(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 64*1024), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	bytes, inodes, err := DirUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if inodes != 2 || bytes < 64*1024 {
		t.Fatalf("bytes %d inodes %d; want ≥65536 bytes and 2 inodes (dir + file)", bytes, inodes)
	}
}

func TestProcessCountsThreadsFDsAndSockets(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A pid above the kernel's maximum never exists: it is skipped.
	threads, fds, sockets := ProcessCounts("/proc", []int{os.Getpid(), 4194305})
	if threads < 1 || fds < 3 || sockets < 1 || sockets > fds {
		t.Fatalf("threads %d fds %d sockets %d", threads, fds, sockets)
	}
	if th, fd, so := ProcessCounts("/proc", nil); th != 0 || fd != 0 || so != 0 {
		t.Fatalf("no pids: %d %d %d", th, fd, so)
	}
}

func TestCapacityOfTheWritableLayerFilesystem(t *testing.T) {
	c, err := Capacity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c.LimitBytes == 0 || c.Inodes == 0 || c.InodesFree > c.Inodes {
		t.Fatalf("capacity %+v", c)
	}
	if _, err := Capacity(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("statfs of a missing dir succeeded")
	}
}

func TestBlkioV1MergesBytesAndCountsByDevice(t *testing.T) {
	got := blkioV1(
		[]*v1stats.BlkIOEntry{{Op: "Read", Device: "/dev/vda", Major: 254, Value: 4096}, {Op: "Write", Device: "/dev/vda", Major: 254, Value: 8192}, {Op: "Total", Device: "/dev/vda", Major: 254, Value: 12288}},
		[]*v1stats.BlkIOEntry{{Op: "Read", Device: "/dev/vda", Major: 254, Value: 1}, {Op: "Write", Device: "/dev/vda", Major: 254, Value: 2}, {Op: "Write", Major: 8, Minor: 16, Value: 5}},
	)
	want := []DeviceIO{
		{Device: "/dev/vda", Major: 254, ReadBytes: 4096, WriteBytes: 8192, Reads: 1, Writes: 2},
		{Device: "8:16", Major: 8, Minor: 16, Writes: 5},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestProcsErrorOfARemovedCgroupIsNotFound(t *testing.T) {
	_, err := os.ReadDir(filepath.Join(t.TempDir(), "gone"))
	if !errors.Is(procsError("/gone", err), errdefs.ErrNotFound) {
		t.Fatalf("removed cgroup: %v", procsError("/gone", err))
	}
	if errors.Is(procsError("/x", errors.New("boom")), errdefs.ErrNotFound) {
		t.Fatal("any other error became NotFound")
	}
}

// procCPU is the user and system time pid has run, from /proc/<pid>/stat.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th of them (14 and 15 of the line), in ticks.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
