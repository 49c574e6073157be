package monitor

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// The exit file is what berthd reads after a restart (decision 0301).
func TestWriteExitIsReadBack(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "exits"), 0o700); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 6, 45, 1, 123456789, time.UTC)
	e := &proto.Exit{Version: proto.ExitVersion, ID: "c1", Pid: 42, Code: 137, Signal: 9, OOMKilled: true, At: at}
	if err := writeExit(dir, e); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(proto.ExitPath(dir, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := proto.DecodeExit(data)
	if err != nil || *got != *e {
		t.Fatalf("read back %+v, %v", got, err)
	}
}

// testContainer is a container as launch leaves it, without a process.
// testPod is a pod of a node without a keeper, registered with the
// node as addPod would.
func testPod(t *testing.T) *Pod {
	root := t.TempDir()
	n := New(filepath.Join(root, ".node"), t.Logf, -1)
	dir := filepath.Join(root, "pod")
	s := newPod(dir, n, t.Logf)
	n.pods[dir] = s
	return s
}

func testContainer(t *testing.T, id string, logf func(string, ...any)) *container {
	c := newContainer(id, &proto.CreateRequest{}, nil, logf)
	c.setProcess(1, phaseCreated)
	return c
}

// The log path runs for every chunk a container writes: it must not
// allocate, or a chatty container would make the monitor collect garbage.
func TestLogPathAllocatesNothing(t *testing.T) {
	c := testContainer(t, "c1", t.Logf)
	c.log.path = filepath.Join(t.TempDir(), "0.log")
	if err := c.log.open(); err != nil {
		t.Fatal(err)
	}
	defer c.closeIO()
	lines := newLineSplitter(func(tag string, msg []byte) { c.writeLog("stdout", tag, msg) })
	fan := func(chunk []byte) { c.attaches.fanout(1, chunk) }
	r := bytes.NewReader(nil)
	chunk := []byte("one line\nand half of anoth")
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(chunk)
		if err := lines.readOnce(r, fan); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per chunk", allocs)
	}
	data, err := os.ReadFile(c.log.path)
	if err != nil || !strings.Contains(string(data), " stdout F one line\n") {
		t.Fatalf("log %q, %v", data, err)
	}
	if n, why := c.log.writeErrors(); n != 0 || why != "" {
		t.Fatalf("write errors %d (%s) on a healthy disk", n, why)
	}
}

// A log the monitor cannot write is counted, reported in the container's
// state and in the monitor's log, once when it starts failing; failing
// writes allocate nothing either (a full disk must not make the monitor
// collect garbage).
func TestLogWriteErrorsAreCountedAndReported(t *testing.T) {
	var logged []string
	c := testContainer(t, "c1", func(format string, args ...any) { logged = append(logged, format) })
	c.log.path = "/dev/full" // every write fails with ENOSPC
	if err := c.log.open(); err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer c.closeIO()
	c.writeLog("stdout", "F", []byte("lost"))
	allocs := testing.AllocsPerRun(20, func() { c.writeLog("stderr", "F", []byte("lost too")) })
	if allocs != 0 {
		t.Errorf("%v allocations per failed record", allocs)
	}
	st := c.state()
	if st.LogWriteErrors != 22 || st.LogWriteError != unix.ENOSPC.Error() {
		t.Fatalf("state: %d errors (%q), want 22 (%q)", st.LogWriteErrors, st.LogWriteError, unix.ENOSPC.Error())
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "write failed") {
		t.Fatalf("monitor log: %q, want one line for the run of failures", logged)
	}
	// The disk has room again: the next record is written, the resumption
	// logged, and the count kept.
	c.log.path = filepath.Join(t.TempDir(), "0.log")
	if err := c.log.open(); err != nil {
		t.Fatal(err)
	}
	c.writeLog("stdout", "F", []byte("back"))
	if len(logged) != 2 || !strings.Contains(logged[1], "resumed") {
		t.Fatalf("monitor log: %q", logged)
	}
	if st := c.state(); st.LogWriteErrors != 22 {
		t.Fatalf("count after resuming: %d", st.LogWriteErrors)
	}
}

// A record cut short (the disk filled in the middle of it) is ended by
// the next record's newline, so the torn line does not swallow it.
func TestTornRecordEndsItsLine(t *testing.T) {
	c := testContainer(t, "c1", t.Logf)
	c.log.path = filepath.Join(t.TempDir(), "0.log")
	if err := c.log.open(); err != nil {
		t.Fatal(err)
	}
	defer c.closeIO()
	c.log.torn = true // as a short writev leaves it
	c.writeLog("stdout", "F", []byte("next"))
	data, err := os.ReadFile(c.log.path)
	if err != nil || !bytes.HasPrefix(data, []byte("\n")) || !bytes.HasSuffix(data, []byte(" stdout F next\n")) {
		t.Fatalf("log %q, %v", data, err)
	}
	if c.log.torn {
		t.Fatal("still torn after a full write")
	}
}

// The housekeeping runs every few seconds for the monitor's whole life: it
// must not allocate, or an idle monitor would pile up garbage until a GC
// (which costs it ~0.4 MiB for good, decision 0303). It must also drop a
// parked wait whose client went away, and only that one.
func TestHousekeepingAllocatesNothingAndDropsGoneWaits(t *testing.T) {
	pair := func() (*os.File, *os.File) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fds[0]), "shim"), os.NewFile(uintptr(fds[1]), "client")
	}
	s := testPod(t)
	c := testContainer(t, "c1", t.Logf)
	if err := s.reserve(c); err != nil {
		t.Fatal(err)
	}
	stay, stayClient := pair()
	defer stayClient.Close()
	gone, goneClient := pair()
	for _, conn := range []*os.File{stay, gone} {
		if parked, err := s.wait(conn, &proto.Request{Op: proto.OpWait, ID: "c1"}); !parked || err != nil {
			t.Fatalf("wait: parked %v, %v", parked, err)
		}
	}
	s.mon.trimNow() // the first check takes the baseline
	allocs := testing.AllocsPerRun(50, s.mon.housekeep)
	if allocs != 0 {
		t.Errorf("%v allocations per housekeeping round", allocs)
	}
	goneClient.Close()
	s.dropGoneWaiters()
	if len(c.waiters) != 1 || c.waiters[0].conn != stay {
		t.Fatalf("waiters after the client left: %d", len(c.waiters))
	}
	if _, err := gone.Write([]byte{0}); err == nil {
		t.Fatal("the gone client's connection is still open")
	}
}

// A container being created is reserved (its ID is taken, the pod stays)
// but no other op sees it before its pid is known.
func TestContainerBeingCreatedIsNotVisible(t *testing.T) {
	s := testPod(t)
	c := newContainer("c1", &proto.CreateRequest{}, nil, t.Logf)
	if err := s.reserve(c); err != nil {
		t.Fatal(err)
	}
	if err := s.reserve(newContainer("c1", &proto.CreateRequest{}, nil, t.Logf)); err == nil {
		t.Fatal("a second create of c1 was let in")
	}
	resp, _ := s.handle(&proto.Request{Op: proto.OpState, ID: "c1"})
	if resp.Kind != proto.KindFailedPrecondition {
		t.Fatalf("state of a container being created: %+v", resp)
	}
	if resp, _ := s.handle(&proto.Request{Op: proto.OpPing}); len(resp.IDs) != 1 {
		t.Fatalf("ping: %+v", resp)
	}
	c.setProcess(42, phaseCreated)
	resp, _ = s.handle(&proto.Request{Op: proto.OpState, ID: "c1"})
	if resp.State == nil || resp.State.Pid != 42 || resp.State.Status != proto.StatusCreated {
		t.Fatalf("state once created: %+v", resp)
	}
}

// The memory budget of berth-shim (keeper and monitor: one binary)
// depends on what it links (decision 0303).
func TestShimLinksNoHeavyPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/berthcri/berth/cmd/berth-shim").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, heavy := range []string{"net", "encoding/json", "os/exec", "google.golang.org/grpc/status", "google.golang.org/protobuf/proto",
		"github.com/opencontainers/runtime-spec/specs-go", "github.com/berthcri/berth/internal/oci", "github.com/berthcri/berth/internal/shim",
		// Its init and first Read make ~30-60 KiB of tables resident
		// (decision 1700); the trim reads /proc/self/statm instead.
		"runtime/metrics"} {
		if deps[heavy] {
			t.Errorf("berth-shim links %s", heavy)
		}
	}
}

// A container's phase only moves forward: a start that returns after the
// container already exited (a process that ends at once) leaves it exited.
func TestPhaseOnlyMovesForward(t *testing.T) {
	c := testContainer(t, "c1", t.Logf)
	if st := c.state(); st.Status != proto.StatusCreated || st.Pid != 1 {
		t.Fatalf("created: %+v", st)
	}
	c.mu.Lock()
	c.phase, c.exit = phaseExited, &proto.Exit{ID: "c1", Code: 0}
	c.mu.Unlock()
	c.started()
	if st := c.state(); st.Status != proto.StatusExited || st.Exit == nil {
		t.Fatalf("started after its exit: %+v", st)
	}
}

// The trim is driven by the kernel's count of anonymous resident pages
// (decision 1700): the first check takes a baseline, growth beyond
// trimMinGrowth trims and moves the baseline.
func TestTrimFollowsAnonymousResidentGrowth(t *testing.T) {
	page := uint64(unix.Getpagesize())
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"5234 180 120 90 0 600 0\n", 60 * page, true},
		{"5234 180 180 90 0 600 0", 0, true},
		{"5234 100 180 90 0 600 0", 0, false},
		{"5234 180", 0, false},
		{"", 0, false},
		{"x 1 2", 0, false},
	} {
		if got, ok := parseStatm([]byte(tc.in)); got != tc.want || ok != tc.ok {
			t.Errorf("parseStatm(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	s := testPod(t)
	n := s.mon
	n.trimNow()
	base := n.trimmedAt
	if base == 0 {
		t.Fatal("no baseline after the first check")
	}
	n.trimNow()
	if n.trimmedAt != base {
		t.Fatalf("baseline moved without growth: %d, then %d", base, n.trimmedAt)
	}
	// The first collection waits for twice the growth the later ones do
	// (its metadata stays resident for good).
	anon, ok := n.statm.anonResident()
	if !ok {
		t.Fatal("no anonymous resident size from /proc/self/statm")
	}
	if n.collected {
		t.Fatal("collected before any growth")
	}
	n.trimmedAt = anon - (trimMinGrowth+firstTrimMinGrowth)/2
	n.trimNow()
	if n.collected {
		t.Fatalf("first collection after growth of %d KiB, below firstTrimMinGrowth", (trimMinGrowth+firstTrimMinGrowth)/2>>10)
	}
	n.trimmedAt = 1 // as if the process had grown by all it holds
	n.trimNow()
	if n.trimmedAt <= 1 || !n.collected {
		t.Fatalf("no trim after growth: baseline %d", n.trimmedAt)
	}
	n.trimmedAt -= (trimMinGrowth + firstTrimMinGrowth) / 2
	before := n.trimmedAt
	n.trimNow()
	if n.trimmedAt == before {
		t.Fatal("no trim after trimMinGrowth once collected")
	}
}

// lookPath finds an executable regular file in PATH, in PATH's order, and
// skips directories and files that are not executable.
func TestLookPath(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(dir1, "tool"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, "tool"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir3 := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir3, "tool"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir1+"::"+dir2+":"+dir3)
	if p, err := lookPath("tool"); err != nil || p != filepath.Join(dir3, "tool") {
		t.Fatalf("lookPath(tool) = %q, %v", p, err)
	}
	if p, err := lookPath("./relative/tool"); err != nil || p != "./relative/tool" {
		t.Fatalf("a path is taken as it is: %q, %v", p, err)
	}
	if _, err := lookPath("missing"); err == nil {
		t.Fatal("found a missing tool")
	}
}
