package fuseconn_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy/fuseconn"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// The test binary is also the helpers the takeover test runs as
// processes of their own: a server and a reader.
const (
	roleEnv     = "FUSECONN_TEST_ROLE"
	settingsEnv = "FUSECONN_TEST_SETTINGS"
	stallEnv    = "FUSECONN_TEST_STALL"
	mountEnv    = "FUSECONN_TEST_MOUNT"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "server":
		os.Exit(runServer())
	case "reader":
		os.Exit(runReader())
	}
	os.Exit(m.Run())
}

var (
	helloData = []byte("hello, world: served before and after the takeover\n")
	aData     = []byte("a\n")
	bData     = []byte("b, looked up only after the takeover\n")
	stallData = []byte("the answer to a read the killed server had taken\n")
)

// mountOptions are the test filesystem's, for the mount and every server.
func mountOptions() fuse.MountOptions {
	return fuse.MountOptions{
		Name:             "berthtest",
		FsName:           "fuseconn-test",
		MaxWrite:         128 << 10,
		DirectMountFlags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV,
		Options:          []string{"default_permissions"},
		Logger:           log.New(os.Stderr, "go-fuse: ", 0),
	}
}

func serveOptions() *fs.Options {
	hour := time.Hour
	return &fs.Options{
		MountOptions: mountOptions(),
		// The kernel keeps entries across the takeover, so the node IDs
		// it holds from the first server reach the second.
		EntryTimeout: &hour,
		AttrTimeout:  &hour,
	}
}

// testFile is a read-only file; if stall is set, a read of it says so on
// stdout and never returns (the server is to be killed in it); if handle
// is set, it is opened with a handle (a number the next server does not
// know), and read by node all the same.
type testFile struct {
	fs.Inode
	data   []byte
	stall  bool
	handle bool
}

type openHandle struct{}

func (f *testFile) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = uint64(len(f.data))
	return 0
}

func (f *testFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	// Every read reaches the server: none is answered from the page
	// cache of the first one.
	if f.handle {
		return &openHandle{}, fuse.FOPEN_DIRECT_IO, 0
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *testFile) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.stall {
		fmt.Println("stalled")
		select {}
	}
	off = min(off, int64(len(f.data)))
	return fuse.ReadResultData(f.data[off:min(off+int64(len(dest)), int64(len(f.data)))]), 0
}

// testRoot is /hello, /dir/{a,b,stall,file-NNN...}, built when it is added, with
// inode numbers in the order of building, as internal/lazy builds a
// layer's tree.
type testRoot struct {
	fs.Inode
	stall bool
}

func (r *testRoot) OnAdd(ctx context.Context) {
	ino := uint64(2)
	add := func(parent *fs.Inode, name string, n fs.InodeEmbedder, mode uint32) *fs.Inode {
		ch := parent.NewPersistentInode(ctx, n, fs.StableAttr{Mode: mode, Ino: ino})
		ino++
		parent.AddChild(name, ch, false)
		return ch
	}
	add(&r.Inode, "hello", &testFile{data: helloData, handle: true}, syscall.S_IFREG)
	dir := add(&r.Inode, "dir", &fs.Inode{}, syscall.S_IFDIR)
	add(dir, "a", &testFile{data: aData}, syscall.S_IFREG)
	add(dir, "b", &testFile{data: bData}, syscall.S_IFREG)
	add(dir, "stall", &testFile{data: stallData, stall: r.stall}, syscall.S_IFREG)
	for i := range manyFiles {
		add(dir, manyName(i), &testFile{data: aData}, syscall.S_IFREG)
	}
}

// manyFiles are enough names in /dir that the kernel lists it in several
// READDIR requests, so that a listing can cross the takeover.
const manyFiles = 300

func manyName(i int) string { return fmt.Sprintf("file-%03d-with-a-name-long-enough-to-fill-pages", i) }

// runServer serves the test tree on fd 3 with the settings file named in
// the environment until the filesystem is unmounted.
func runServer() int {
	s, err := fuseconn.Load(os.Getenv(settingsEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dev := os.NewFile(3, "/dev/fuse")
	srv, err := fuseconn.Serve(dev, s, &testRoot{stall: os.Getenv(stallEnv) != ""}, serveOptions(), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dev.Close()
	fmt.Println("serving")
	srv.Wait()
	return 0
}

// runReader reads the mount named in the environment: a file it keeps
// open, then, in the background, the stalling file; on "go" from stdin,
// the open file again and a file it never looked up before.
func runReader() int {
	mnt := os.Getenv(mountEnv)
	say := func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	f, err := os.Open(filepath.Join(mnt, "hello"))
	if err != nil {
		say("err %v", err)
		return 1
	}
	defer f.Close()
	buf := make([]byte, 5)
	if _, err := f.ReadAt(buf, 0); err != nil {
		say("err %v", err)
		return 1
	}
	say("hello %s", buf)
	if _, err := os.ReadFile(filepath.Join(mnt, "dir", "a")); err != nil {
		say("err %v", err)
		return 1
	}
	say("a ok")
	// A listing of /dir begun here and finished after the takeover, on
	// the handle the first server gave.
	d, err := os.Open(filepath.Join(mnt, "dir"))
	if err != nil {
		say("err %v", err)
		return 1
	}
	defer d.Close()
	listed, err := d.Readdirnames(1)
	if err != nil {
		say("err list: %v", err)
		return 1
	}
	say("listing")
	stalled := make(chan struct{})
	go func() {
		defer close(stalled)
		data, err := os.ReadFile(filepath.Join(mnt, "dir", "stall"))
		if err != nil {
			say("err stall: %v", err)
			return
		}
		say("stall %q", data)
	}()
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		say("err no go")
		return 1
	}
	if _, err := f.ReadAt(buf, 7); err != nil {
		say("err hello again: %v", err)
		return 1
	}
	say("hello again %s", buf)
	data, err := os.ReadFile(filepath.Join(mnt, "dir", "b"))
	if err != nil {
		say("err b: %v", err)
		return 1
	}
	say("b %q", data)
	// A listing the new server begins and ends (its first directory
	// handle), then the rest of the one the first server began.
	root, err := os.ReadDir(mnt)
	if err != nil {
		say("err root: %v", err)
		return 1
	}
	say("root %d", len(root))
	// The rest of the listing after one more server (a handle two
	// generations old).
	if !in.Scan() || in.Text() != "more" {
		say("err no more")
		return 1
	}
	rest, err := d.Readdirnames(-1)
	if err != nil {
		say("err list again: %v", err)
		return 1
	}
	seen := map[string]bool{}
	for _, n := range append(listed, rest...) {
		seen[n] = true
	}
	say("listed %d names, %d distinct", len(listed)+len(rest), len(seen))
	<-stalled
	say("done")
	return 0
}

// rig is a mount made by the test (the parent that holds the connection)
// and the helper processes that use it.
type rig struct {
	mnt       string
	dev       *os.File
	settings  *fuseconn.Settings
	helpers   []*helper
	unmounted bool
}

// mount mounts the test filesystem. The cleanup, on any outcome, kills
// the helpers, then drops the connection (closing the last fd of a
// connection aborts it: a reader stuck in a request that a dead server
// had taken cannot be killed until then), and only then waits for them.
func mount(t *testing.T) *rig {
	t.Helper()
	r := &rig{mnt: t.TempDir()}
	opts := mountOptions()
	var err error
	if r.dev, r.settings, err = fuseconn.Mount(r.mnt, &opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, h := range r.helpers {
			if !h.waited {
				_ = h.cmd.Process.Kill()
			}
		}
		if !r.unmounted {
			_ = fuseconn.Unmount(r.mnt)
			r.dev.Close()
		}
		for _, h := range r.helpers {
			if !h.waited {
				_ = h.cmd.Wait()
			}
			if h.stderr.Len() > 0 {
				t.Logf("%s stderr:\n%s", h.name, h.stderr.String())
			}
		}
	})
	return r
}

// helper is a helper process whose stdout the test reads line by line.
type helper struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	waited bool
}

// lineWait bounds how long a test waits for a helper's next line: it
// turns a hang (a reader never answered) into a failure that says where;
// it measures nothing.
const lineWait = 2 * time.Minute

// start runs the test binary as a helper; a server gets the connection
// as its fd 3.
func (r *rig) start(t *testing.T, name string, env []string, withConn bool) *helper {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &helper{name: name, cmd: exec.Command(exe), lines: make(chan string, 16)}
	h.cmd.Env = append(os.Environ(), env...)
	h.cmd.Stderr = &h.stderr
	if withConn {
		h.cmd.ExtraFiles = []*os.File{r.dev}
	}
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.helpers = append(r.helpers, h)
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	return h
}

func (h *helper) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got, ok := <-h.lines:
		if !ok {
			t.Fatalf("%s ended before %q (stderr: %s)", h.name, want, h.stderr.String())
		}
		if got != want {
			t.Fatalf("%s said %q, want %q", h.name, got, want)
		}
	case <-time.After(lineWait):
		t.Fatalf("%s did not say %q within %v", h.name, want, lineWait)
	}
}

// wait closes the helper's stdin and waits for it to exit, successfully.
func (h *helper) wait(t *testing.T) {
	t.Helper()
	h.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- h.cmd.Wait() }()
	select {
	case err := <-done:
		h.waited = true
		if err != nil {
			t.Fatalf("%s: %v (stderr: %s)", h.name, err, h.stderr.String())
		}
	case <-time.After(lineWait):
		t.Fatalf("%s did not exit within %v", h.name, lineWait)
	}
}

func (h *helper) kill(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
	h.waited = true
}

func requireFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
}

// The server is killed (-9) while a reader holds a file open (with a
// handle the first server gave), is halfway through listing a directory,
// and is blocked in a read the server had taken; a new server process
// takes the connection the test (the mount's parent) kept. The blocked
// read is answered, the open file reads on, a name never looked up
// before resolves; that server is killed in turn and a third one ends
// the listing where it was (every name once). Nobody sees ENOTCONN. Then
// the mount goes and leaves no mount, process or fd behind.
func TestKilledServerIsReplacedOnTheSameConnection(t *testing.T) {
	requireFUSE(t)
	fdsBefore := leakcheck.OwnFDs(t)

	r := mount(t)
	if !r.settings.CanResend() {
		t.Skip("this kernel has no FUSE_NOTIFY_RESEND (Linux 6.9)")
	}
	settings := filepath.Join(t.TempDir(), "fuse.json")
	if err := r.settings.Save(settings); err != nil {
		t.Fatal(err)
	}
	serverEnv := func(stall bool) []string {
		env := []string{roleEnv + "=server", settingsEnv + "=" + settings}
		if stall {
			env = append(env, stallEnv+"=1")
		}
		return env
	}

	first := r.start(t, "first server", serverEnv(true), true)
	first.expect(t, "serving")
	reader := r.start(t, "reader", []string{roleEnv + "=reader", mountEnv + "=" + r.mnt}, false)
	reader.expect(t, "hello "+string(helloData[:5]))
	reader.expect(t, "a ok")
	reader.expect(t, "listing")
	first.expect(t, "stalled")
	first.kill(t)

	second := r.start(t, "second server", serverEnv(false), true)
	second.expect(t, "serving")
	reader.expect(t, fmt.Sprintf("stall %q", stallData))
	if _, err := io.WriteString(reader.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	reader.expect(t, "hello again "+string(helloData[7:12]))
	reader.expect(t, fmt.Sprintf("b %q", bData))
	reader.expect(t, "root 2")

	// And once more, with nothing in flight.
	second.kill(t)
	third := r.start(t, "third server", serverEnv(false), true)
	third.expect(t, "serving")
	if _, err := io.WriteString(reader.stdin, "more\n"); err != nil {
		t.Fatal(err)
	}
	reader.expect(t, fmt.Sprintf("listed %d names, %d distinct", 3+manyFiles, 3+manyFiles))
	reader.expect(t, "done")
	reader.wait(t)

	// Nothing uses the filesystem now: a plain unmount must succeed, and
	// the server ends with the connection.
	if err := unix.Unmount(r.mnt, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	r.dev.Close()
	r.unmounted = true
	third.wait(t)

	if m, err := berthdtest.MountsBelow(r.mnt); err != nil || len(m) > 0 {
		t.Errorf("mounts left: %v (%v)", m, err)
	}
	if kids := leakcheck.Children(t); len(kids) > 0 {
		t.Errorf("processes left: %v", kids)
	}
	if leaked := leakcheck.NewFDs(fdsBefore, leakcheck.OwnFDs(t)); len(leaked) > 0 {
		t.Errorf("fds left: %v", leaked)
	}
}

// A server whose options would answer INIT otherwise than the mount did
// is refused before it reads a request, and the connection stays whole:
// a server with the mount's options serves it next.
func TestServeRefusesOtherOptionsAndLeavesTheConnection(t *testing.T) {
	requireFUSE(t)
	mnt := t.TempDir()
	opts := mountOptions()
	dev, s, err := fuseconn.Mount(mnt, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fuseconn.Unmount(mnt)
		dev.Close()
	})

	other := serveOptions()
	other.MaxWrite = 64 << 10
	if _, err := fuseconn.Serve(dev, s, &testRoot{}, other, ""); err == nil || !strings.Contains(err.Error(), "options differ") {
		t.Fatalf("Serve with another MaxWrite = %v, want a refusal", err)
	}

	srv, err := fuseconn.Serve(dev, s, &testRoot{}, serveOptions(), "")
	if err != nil {
		t.Fatal(err)
	}
	// Read with raw system calls: os.Open would register the file with
	// the runtime's epoll, whose first FUSE_POLL this very process must
	// answer, and that can deadlock (go-fuse's fuse/poll.go).
	fd, err := unix.Open(filepath.Join(mnt, "dir", "a"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64)
	n, err := unix.Read(fd, got)
	unix.Close(fd)
	if err != nil || !bytes.Equal(got[:n], aData) {
		t.Fatalf("read = %q, %v; want %q", got[:n], err, aData)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	srv.Wait()
}
