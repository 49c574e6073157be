package shim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// fixture is a pod the node's monitor serves, with a directory for
// bundles.
type fixture struct {
	t      *testing.T
	dir    string
	rootfs string
	client *shim.Client
	rt     shim.Runtime
	cgroup string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	berthdtest.RequireRoot(t)
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc not installed")
	}
	dir, err := os.MkdirTemp("", "berth-shimtest-")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{
		t:      t,
		dir:    dir,
		rootfs: filepath.Join(dir, "rootfs"),
		rt:     shim.Runtime{Binary: "runc", Root: filepath.Join(dir, "runc")},
		cgroup: "berthshimtest-" + filepath.Base(dir),
	}
	t.Cleanup(func() {
		if err := berthdtest.CleanupNode(dir, f.cgroup); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	bundletest.WriteRootfs(t, f.rootfs)
	client, err := shim.Launch(context.Background(), bundletest.ShimBinary(t), filepath.Join(dir, "shims", strings.Repeat("p", 64)), "pod1")
	if err != nil {
		t.Fatal(err)
	}
	f.client = client
	return f
}

// nodeDir is the directory of the node's keeper and monitor.
func (f *fixture) nodeDir() string { return proto.NodeDir(filepath.Dir(f.client.Dir())) }

// shimPid finds the fixture's keeper or monitor (mode).
func (f *fixture) shimPid(mode string) int {
	f.t.Helper()
	pid := f.findShim(mode)
	if pid == 0 {
		f.t.Fatalf("no berth-shim %s for %s", mode, f.nodeDir())
	}
	return pid
}

// shimPids lists the fixture's keeper and monitor processes.
func (f *fixture) shimPids() []int { return berthdtest.PidsMentioning(f.nodeDir() + "\x00") }

// findShim is shimPid for polls: 0 when none runs, as between a monitor
// handing over and the keeper starting the next.
func (f *fixture) findShim(mode string) int {
	for _, pid := range f.shimPids() {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmd, []byte("\x00"+mode+"\x00")) {
			return pid
		}
	}
	return 0
}

// bundle writes a config.json running args; edit adjusts the spec.
func (f *fixture) bundle(id string, args []string, edit func(*specs.Spec)) string {
	f.t.Helper()
	b := filepath.Join(f.dir, "bundles", id)
	if err := os.MkdirAll(b, 0o700); err != nil {
		f.t.Fatal(err)
	}
	spec := bundletest.Spec(f.rootfs, f.cgroup, id, args)
	spec.Root.Readonly = true
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}})
	if edit != nil {
		edit(spec)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b, "config.json"), data, 0o600); err != nil {
		f.t.Fatal(err)
	}
	return b
}

func (f *fixture) run(id string, args []string, edit func(*specs.Spec)) string {
	f.t.Helper()
	ctx := context.Background()
	logPath := filepath.Join(f.dir, "logs", id+".log")
	b := f.bundle(id, args, edit)
	if err := f.client.Create(ctx, id, &shim.CreateRequest{Bundle: b, LogPath: logPath, Runtime: f.rt}); err != nil {
		f.t.Fatalf("create %s: %v", id, err)
	}
	st, err := f.client.State(ctx, id)
	if err != nil || st.Status != shim.StatusCreated || st.Pid <= 0 {
		f.t.Fatalf("state after create: %+v, %v", st, err)
	}
	if _, err := f.client.Start(ctx, id); err != nil {
		f.t.Fatalf("start %s: %v", id, err)
	}
	return logPath
}

func (f *fixture) wait(id string) *shim.State {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := f.client.Wait(ctx, id)
	if err != nil {
		f.t.Fatalf("wait %s: %v", id, err)
	}
	if st.Status != shim.StatusExited || st.Exit == nil {
		f.t.Fatalf("after wait: %+v", st)
	}
	return st
}

var recordRE = regexp.MustCompile(`^(\S+) (stdout|stderr) (F|P) (.*)$`)

type record struct {
	at             time.Time
	stream, tag, m string
}

func readLog(t *testing.T, path string) []record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []record
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		m := recordRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("log line not in CRI format: %q", line)
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatalf("bad timestamp in %q: %v", line, err)
		}
		recs = append(recs, record{at, m[2], m[3], m[4]})
	}
	return recs
}

func TestShimRunLogsAndExitCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logPath := f.run("c1", []string{"sh", "-c", "echo hello; echo oops >&2; echo world; exit 3"}, nil)
	st := f.wait("c1")
	if st.Exit.Code != 3 || st.Exit.OOMKilled {
		t.Fatalf("exit = %+v, want code 3", st.Exit)
	}
	// The exit is persisted for a berthd that was down.
	e, ok, err := shim.ReadExit(f.client.Dir(), "c1")
	if err != nil || !ok || e.Code != 3 || e.At.IsZero() || e.Version != 1 {
		t.Fatalf("persisted exit = %+v %v %v", e, ok, err)
	}
	recs := readLog(t, logPath)
	var out, errs []string
	for _, r := range recs {
		if r.tag != "F" {
			t.Errorf("unexpected partial record %+v", r)
		}
		if r.stream == "stdout" {
			out = append(out, r.m)
		} else {
			errs = append(errs, r.m)
		}
	}
	if strings.Join(out, ",") != "hello,world" || strings.Join(errs, ",") != "oops" {
		t.Fatalf("stdout %q stderr %q", out, errs)
	}
	// Start of an exited container is a precondition failure.
	if _, err := f.client.Start(context.Background(), "c1"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("start exited: %v", err)
	}
}

func TestShimLongLineSplitIntoPartials(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// 40000 'a' then a newline, then a short line.
	logPath := f.run("long", []string{"sh", "-c", "head -c 40000 /dev/zero | tr '\\0' a; echo; echo short"}, nil)
	f.wait("long")
	recs := readLog(t, logPath)
	var tags []string
	var full strings.Builder
	for _, r := range recs {
		tags = append(tags, r.tag)
		if len(r.m) > 16<<10 {
			t.Errorf("record of %d bytes exceeds 16 KiB", len(r.m))
		}
		if r.m != "short" {
			full.WriteString(r.m)
		}
	}
	if got := strings.Join(tags, ""); got != "PPFF" {
		t.Fatalf("tags = %s, want PPFF", got)
	}
	if full.String() != strings.Repeat("a", 40000) {
		t.Fatalf("reassembled line has %d bytes", full.Len())
	}
}

func TestShimKillAndDeleteExitsShim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.run("sleeper", []string{"sleep", "1000"}, nil)
	st, err := f.client.State(ctx, "sleeper")
	if err != nil || st.Status != shim.StatusRunning {
		t.Fatalf("state: %+v %v", st, err)
	}
	if err := f.client.Kill(ctx, "sleeper", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	st = f.wait("sleeper")
	if st.Exit.Code != 137 || st.Exit.Signal != int(syscall.SIGKILL) {
		t.Fatalf("exit = %+v, want 137", st.Exit)
	}
	// Killing an exited container is fine.
	if err := f.client.Kill(ctx, "sleeper", syscall.SIGTERM, false); err != nil {
		t.Fatalf("kill exited: %v", err)
	}
	if _, err := f.client.Delete(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	// Last container gone: the pod ends, its directory removed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat(f.client.Dir())
		if os.IsNotExist(err) && len(berthdtest.PidsMentioning(f.client.Dir())) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shim still around: dir err %v, pids %v", err, berthdtest.PidsMentioning(f.client.Dir()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := f.client.State(ctx, "sleeper"); !errors.Is(err, shim.ErrNoShim) {
		t.Fatalf("state after shim exit: %v", err)
	}
}

func TestShimOOMKilled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	limit := int64(8 << 20)
	f.run("oom", []string{"sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"}, func(s *specs.Spec) {
		s.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	})
	st := f.wait("oom")
	if !st.Exit.OOMKilled || st.Exit.Code != 137 {
		t.Fatalf("exit = %+v, want OOM kill", st.Exit)
	}
}

func TestShimAttachStdinAndReopenLog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	logPath := filepath.Join(f.dir, "logs", "cat.log")
	b := f.bundle("cat", []string{"cat"}, nil)
	if err := f.client.Create(ctx, "cat", &shim.CreateRequest{Bundle: b, LogPath: logPath, Runtime: f.rt, Stdin: true, StdinOnce: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.Start(ctx, "cat"); err != nil {
		t.Fatal(err)
	}
	s, err := f.client.Attach(ctx, "cat", true, true, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stdin([]byte("line one\n")); err != nil {
		t.Fatal(err)
	}
	kind, p, err := s.Recv()
	if err != nil || kind != shim.FrameStdout || string(p) != "line one\n" {
		t.Fatalf("recv = %d %q %v", kind, p, err)
	}
	// Rotate: rename, reopen, write more.
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := f.client.ReopenLog(ctx, "cat"); err != nil {
		t.Fatal(err)
	}
	if err := s.Stdin([]byte("line two\n")); err != nil {
		t.Fatal(err)
	}
	if _, p, err := s.Recv(); err != nil || string(p) != "line two\n" {
		t.Fatalf("recv = %q %v", p, err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	st := f.wait("cat")
	s.Close()
	if st.Exit.Code != 0 {
		t.Fatalf("exit %+v", st.Exit)
	}
	if r := readLog(t, logPath+".1"); len(r) != 1 || r[0].m != "line one" {
		t.Fatalf("old log %+v", r)
	}
	if r := readLog(t, logPath); len(r) != 1 || r[0].m != "line two" {
		t.Fatalf("new log %+v", r)
	}
}

func TestShimTerminal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	logPath := filepath.Join(f.dir, "logs", "tty.log")
	b := f.bundle("tty", []string{"sh", "-c", "sleep 0.3; stty size; test -t 0 && echo isatty"}, func(s *specs.Spec) {
		s.Process.Terminal = true
	})
	if err := f.client.Create(ctx, "tty", &shim.CreateRequest{Bundle: b, LogPath: logPath, Runtime: f.rt, Terminal: true, Stdin: true}); err != nil {
		t.Fatal(err)
	}
	s, err := f.client.Attach(ctx, "tty", true, true, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Resize(100, 30); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := f.client.Start(ctx, "tty"); err != nil {
		t.Fatal(err)
	}
	f.wait("tty")
	data, _ := os.ReadFile(logPath)
	if !bytes.Contains(data, []byte("30 100")) || !bytes.Contains(data, []byte("isatty")) {
		t.Fatalf("tty log:\n%s", data)
	}
}

func TestShimCreateFailureCarriesRuntimeError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	// Keep one container so the pod stays up after the failure.
	f.run("keep", []string{"sleep", "1000"}, nil)
	b := f.bundle("bad", []string{"/no/such/binary"}, nil)
	err := f.client.Create(ctx, "bad", &shim.CreateRequest{Bundle: b, Runtime: f.rt})
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("create with missing binary: %v", err)
	}
	if _, err := f.client.State(ctx, "bad"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("state of failed container: %v", err)
	}
	ids, err := f.client.List(ctx)
	if err != nil || fmt.Sprint(ids) != "[keep]" {
		t.Fatalf("list = %v %v", ids, err)
	}
}

func TestShimDropsWaitsOfVanishedClients(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.run("sleeper", []string{"sleep", "1000"}, nil)
	monitor := f.shimPid("monitor")
	fds := func() int {
		entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", monitor))
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	before := fds()
	// Five clients wait and go away, as a killed berthd's would.
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if _, err := f.client.Wait(ctx, "sleeper"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait: %v", err)
		}
		cancel()
	}
	deadline := time.Now().Add(15 * time.Second)
	for fds() > before {
		if time.Now().After(deadline) {
			t.Fatalf("shim holds %d fds, had %d: abandoned waits kept", fds(), before)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestShimHighVolumeOutputIsComplete(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logPath := f.run("seq", []string{"sh", "-c", "seq 1 200000; seq 1 50000 >&2"}, nil)
	if st := f.wait("seq"); st.Exit.Code != 0 {
		t.Fatalf("exit %+v", st.Exit)
	}
	next := map[string]int{"stdout": 1, "stderr": 1}
	for _, r := range readLog(t, logPath) {
		if r.tag != "F" || r.m != fmt.Sprint(next[r.stream]) {
			t.Fatalf("%s: got %q (%s), want %d", r.stream, r.m, r.tag, next[r.stream])
		}
		next[r.stream]++
	}
	if next["stdout"] != 200001 || next["stderr"] != 50001 {
		t.Fatalf("lines: %v", next)
	}
}

func TestShimShutdownOnlyWhenEmpty(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.run("sleeper", []string{"sleep", "1000"}, nil)
	if err := f.client.Shutdown(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("shutdown of a shim holding a container: %v, want FailedPrecondition", err)
	}
	if err := f.client.Kill(ctx, "sleeper", syscall.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	f.wait("sleeper")
	// A delete that empties the pod ends it; start a fresh, empty
	// one instead to test Shutdown itself.
	empty, err := shim.Launch(ctx, bundletest.ShimBinary(t), filepath.Join(f.dir, "shims", strings.Repeat("q", 64)), "pod2")
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown of an empty shim: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := os.Stat(empty.Dir())
		if os.IsNotExist(err) && len(berthdtest.PidsMentioning(empty.Dir())) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("empty shim still around after shutdown: dir err %v, pids %v", err, berthdtest.PidsMentioning(empty.Dir()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := f.client.State(ctx, "sleeper"); err != nil {
		t.Fatalf("the other shim went too: %v", err)
	}
}

// A CRI log on a full disk: the monitor counts the records it could not
// write and reports them in the container's state, and the container
// itself runs on unharmed.
func TestShimLogOnFullDiskIsReported(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	logDir := filepath.Join(f.dir, "fulllogs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", logDir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount a tiny tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(logDir, syscall.MNT_DETACH) })
	logPath := filepath.Join(logDir, "seq.log")
	b := f.bundle("seq", []string{"sh", "-c", "seq 1 20000; echo done >&2"}, nil)
	if err := f.client.Create(ctx, "seq", &shim.CreateRequest{Bundle: b, LogPath: logPath, Runtime: f.rt}); err != nil {
		t.Fatal(err)
	}
	st, err := f.client.State(ctx, "seq")
	if err != nil || st.LogWriteErrors != 0 {
		t.Fatalf("state before any output: %+v, %v", st, err)
	}
	if _, err := f.client.Start(ctx, "seq"); err != nil {
		t.Fatal(err)
	}
	if st := f.wait("seq"); st.Exit.Code != 0 {
		t.Fatalf("exit %+v", st.Exit)
	}
	st, err = f.client.State(ctx, "seq")
	if err != nil {
		t.Fatal(err)
	}
	// 20001 records of ~40 bytes, 64 KiB of room: most are lost.
	if st.LogWriteErrors < 10000 || st.LogWriteError != syscall.ENOSPC.Error() {
		t.Fatalf("state: %d log write errors (%q), want most of 20001 (%q)", st.LogWriteErrors, st.LogWriteError, syscall.ENOSPC.Error())
	}
	// Once, when the failures start (the first is the record the disk
	// filled in the middle of: a short write).
	data, err := os.ReadFile(filepath.Join(f.nodeDir(), "shim.log"))
	if err != nil || bytes.Count(data, []byte("container seq: CRI log "+logPath+": write failed (")) != 1 {
		t.Fatalf("shim log does not say so once: %v\n%s", err, data)
	}
	logData, err := os.ReadFile(logPath)
	if err != nil || !recordRE.Match(bytes.SplitN(logData, []byte("\n"), 2)[0]) || !bytes.Contains(logData, []byte(" stdout F 1\n")) {
		t.Fatalf("the records before the disk filled are gone: %v", err)
	}
}

// A container created to be restored from a checkpoint has no process
// until its start; one killed or deleted before it exits without ever
// running, and a failed restore leaves it created and deletable.
func TestShimRestorePendingContainer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	for _, id := range []string{"killed", "badimages"} {
		b := f.bundle(id, []string{"sleep", "1000"}, nil)
		cr := &shim.CreateRequest{Bundle: b, Runtime: f.rt, Restore: filepath.Join(f.dir, "no-such-images")}
		if err := f.client.Create(ctx, id, cr); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		st, err := f.client.State(ctx, id)
		if err != nil || st.Status != shim.StatusCreated || st.Pid != 0 {
			t.Fatalf("state after create: %+v, %v", st, err)
		}
	}
	if err := f.client.Kill(ctx, "killed", syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	if st := f.wait("killed"); st.Exit.Code != 128+int(syscall.SIGTERM) || st.Exit.Pid != 0 {
		t.Fatalf("exit = %+v", st.Exit)
	}
	if _, err := f.client.Start(ctx, "badimages"); err == nil || !strings.Contains(err.Error(), "restore") {
		t.Fatalf("start from missing images: %v", err)
	}
	if st, err := f.client.State(ctx, "badimages"); err != nil || st.Status != shim.StatusCreated || st.Pid != 0 {
		t.Fatalf("state after failed restore: %+v, %v", st, err)
	}
	for _, id := range []string{"killed", "badimages"} {
		if _, err := f.client.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	if ids, err := f.client.List(ctx); err == nil && len(ids) != 0 {
		t.Fatalf("shim still holds %v", ids)
	}
}
