package shim_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// lazyNode is a node dir with no pod, and a bin dir holding berth-shim
// and, in berth-lazy's place, a script that records its pid and reads
// its link (fd 3) to its end, as the real server does: what the keeper
// does with the server is TestLazyServerRestartedThenGivenUp's, and
// serving a layer is lazysrv's; here the layers' way from berthd to the
// keeper is tested, which needs no FUSE mount (an unmounted /dev/fuse fd
// is a connection the keeper holds all the same).
type lazyNode struct {
	t      *testing.T
	dir    string
	shims  string
	binary string
	starts string // the server's pids, one a line
}

func newLazyNode(t *testing.T) *lazyNode { return newLazyNodeServing(t, "cat <&3 >/dev/null") }

// newLazyNodeServing is newLazyNode with serve, a shell command, in the
// server script's place.
func newLazyNodeServing(t *testing.T, serve string) *lazyNode {
	t.Helper()
	berthdtest.RequireRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	dir, err := os.MkdirTemp("", "berth-lazyshim-")
	if err != nil {
		t.Fatal(err)
	}
	// No cgroup here: only what names the dir is killed.
	t.Cleanup(func() {
		for _, pid := range berthdtest.PidsMentioning(dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	n := &lazyNode{t: t, dir: dir, shims: filepath.Join(dir, "shims"), binary: filepath.Join(dir, "bin", "berth-shim"), starts: filepath.Join(dir, "starts")}
	if err := os.MkdirAll(filepath.Dir(n.binary), 0o755); err != nil {
		t.Fatal(err)
	}
	// A copy, not a link: the keeper finds berth-lazy beside the binary
	// it runs from (its /proc/self/exe, links resolved).
	data, err := os.ReadFile(bundletest.ShimBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(n.binary, data, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\necho $$ >> %s\n%s\n", n.starts, serve)
	if err := os.WriteFile(filepath.Join(dir, "bin", proto.LazyServerBinary), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *lazyNode) nodeDir() string { return proto.NodeDir(n.shims) }

// pids lists the node's processes: keeper, monitor and server (its
// --log names the node dir).
func (n *lazyNode) pids() []int { return berthdtest.PidsMentioning(n.nodeDir()) }

func (n *lazyNode) shim(mode string) int {
	for _, pid := range berthdtest.PidsMentioning(n.nodeDir() + "\x00") {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmd), "\x00"+mode+"\x00") {
			return pid
		}
	}
	return 0
}

// servers lists the pids the server script recorded.
func (n *lazyNode) servers() []string {
	data, _ := os.ReadFile(n.starts)
	return strings.Fields(string(data))
}

// layer makes a chain ID and its dir (the dir need not exist: the keeper
// reads nothing of it, the script neither).
func (n *lazyNode) layer(c byte) (string, string) {
	hex := strings.Repeat(string(c), 64)
	return "sha256:" + hex, filepath.Join(n.dir, "layers", hex)
}

// procStatTail is a /proc/<pid>/stat line after its state: " <ppid> ...".
func procStatTail(stat []byte) string {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || len(s) < i+3 {
		return ""
	}
	return s[i+3:]
}

// openFuse opens a /dev/fuse connection (unmounted).
func openFuse(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// fuseFds counts pid's /dev/fuse descriptors.
func fuseFds(t *testing.T, pid int) int {
	t.Helper()
	return fdsOn(t, pid, "/dev/fuse")
}

// fdsOn counts pid's descriptors on target.
func fdsOn(t *testing.T, pid int, target string) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, e := range es {
		if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); got == target {
			count++
		}
	}
	return count
}

func (n *lazyNode) held(ctx context.Context) []string {
	n.t.Helper()
	ids, err := shim.HeldLazyLayers(ctx, n.shims)
	if err != nil {
		n.t.Fatalf("HeldLazyLayers: %v", err)
	}
	return ids
}

// A lazy layer's hold with no node running launches the node's keeper
// and monitor, the keeper holds the connection and starts the server;
// the node stays while the layer is held (StopIdleNode leaves it), a
// monitor killed is restarted and lists the layer again (the keeper's
// adopt list names it), and once the layer is dropped the node ends:
// keeper, monitor and server gone, no connection held, the node dir
// removed.
func TestLazyLayerHeldByTheNode(t *testing.T) {
	t.Parallel()
	n := newLazyNode(t)
	ctx := context.Background()
	id, dir := n.layer('a')
	if ids := n.held(ctx); len(ids) != 0 {
		t.Fatalf("held with no node: %v", ids)
	}
	if err := shim.DropLazyLayer(ctx, n.shims, id); err != nil {
		t.Fatalf("drop with no node: %v", err)
	}
	if pids := n.pids(); len(pids) != 0 {
		t.Fatalf("processes after a list and a drop with no node: %v", pids)
	}

	conn := openFuse(t)
	if err := shim.HoldLazyLayer(ctx, n.binary, n.shims, id, dir, conn); err != nil {
		t.Fatal(err)
	}
	conn.Close() // the caller's copy: the keeper has its own
	keeper, monitor := n.shim("keeper"), n.shim("monitor")
	if keeper == 0 || monitor == 0 {
		t.Fatalf("after the hold: keeper %d, monitor %d", keeper, monitor)
	}
	// The hold is answered once the monitor sent it: the fd may still be
	// on its way, in the keeper's link (where the monitor's death does
	// not lose it: the keeper reads the link to its end).
	waitFor(t, "the keeper to hold the connection", func() bool { return fuseFds(t, keeper) == 1 })
	if c := fuseFds(t, monitor); c != 0 {
		t.Fatalf("the monitor kept %d /dev/fuse fds", c)
	}
	waitFor(t, "the server's start", func() bool { return len(n.servers()) == 1 })
	server := n.servers()[0]
	if stat, _ := os.ReadFile("/proc/" + server + "/stat"); !strings.HasPrefix(procStatTail(stat), fmt.Sprintf(" %d ", keeper)) {
		t.Fatalf("the server %s is not the keeper's child: %s", server, stat)
	}
	if ids := n.held(ctx); !slices.Equal(ids, []string{id}) {
		t.Fatalf("held: %v, want [%s]", ids, id)
	}

	// The node holds a layer: not idle.
	if err := shim.StopIdleNode(ctx, n.shims); err != nil {
		t.Fatalf("StopIdleNode with a layer held: %v", err)
	}
	if k, m := n.shim("keeper"), n.shim("monitor"); k != keeper || m != monitor {
		t.Fatalf("StopIdleNode stopped a node holding a layer: keeper %d, monitor %d", k, m)
	}

	// A monitor killed: the keeper's next one knows the layer.
	if err := syscall.Kill(monitor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new monitor", func() bool { m := n.shim("monitor"); return m != 0 && m != monitor })
	if ids := n.held(ctx); !slices.Equal(ids, []string{id}) {
		t.Fatalf("held after the monitor's restart: %v, want [%s]", ids, id)
	}
	if k := n.shim("keeper"); k != keeper || fuseFds(t, keeper) != 1 || !slices.Equal(n.servers(), []string{server}) {
		t.Fatalf("after the monitor's restart: keeper %d (was %d), %d fds held, servers %v (was %s)", k, keeper, fuseFds(t, keeper), n.servers(), server)
	}

	if err := shim.DropLazyLayer(ctx, n.shims, id); err != nil {
		t.Fatal(err)
	}
	if err := shim.StopIdleNode(ctx, n.shims); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "keeper, monitor and server to exit", func() bool { return len(n.pids()) == 0 })
	// Gone, or a zombie its new parent has yet to reap (its cmdline is
	// empty then, so pids does not list it).
	if stat, err := os.ReadFile("/proc/" + server + "/stat"); err == nil && !strings.HasPrefix(string(stat)[strings.LastIndexByte(string(stat), ')'):], ") Z ") {
		t.Fatalf("the server %s still runs: %s", server, stat)
	}
	if _, err := os.Stat(n.nodeDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node dir after the end: %v", err)
	}
	if ids := n.held(ctx); len(ids) != 0 {
		t.Fatalf("held after the end: %v", ids)
	}
}

// Bad input to the lazy API is refused before anything is sent.
func TestLazyHoldRefusesBadArguments(t *testing.T) {
	t.Parallel()
	n := newLazyNode(t)
	ctx := context.Background()
	id, dir := n.layer('b')
	conn := openFuse(t)
	for _, tc := range []struct {
		name    string
		id, dir string
		conn    *os.File
	}{
		{"uppercase chain ID", "sha256:" + strings.Repeat("B", 64), dir, conn},
		{"short chain ID", "sha256:bbbb", dir, conn},
		{"chain ID without its algorithm", strings.Repeat("b", 64), dir, conn},
		{"relative dir", id, "layers/b", conn},
		{"unclean dir", id, dir + "/../b", conn},
		{"root dir", id, "/", conn},
		{"no connection", id, dir, nil},
	} {
		err := shim.HoldLazyLayer(ctx, n.binary, n.shims, tc.id, tc.dir, tc.conn)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
	if err := shim.DropLazyLayer(ctx, n.shims, "sha256:../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("drop of a bad chain ID: %v, want InvalidArgument", err)
	}
	if pids := n.pids(); len(pids) != 0 {
		t.Fatalf("bad holds started processes: %v", pids)
	}
	// No berth-lazy beside berth-shim: the layer would never be served.
	if err := os.Remove(filepath.Join(filepath.Dir(n.binary), proto.LazyServerBinary)); err != nil {
		t.Fatal(err)
	}
	if err := shim.HoldLazyLayer(ctx, n.binary, n.shims, id, dir, conn); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("hold with no server binary: %v, want FailedPrecondition", err)
	}
}

// Hostile requests on node.sock: a lazy-hold with no fd, with two (in
// one control message or two), with more than the monitor makes room
// for, with an fd that is not /dev/fuse, with a bad chain ID or dir, and
// another op carrying an fd. Each is refused with InvalidArgument,
// nothing is held, and the monitor is left with no descriptor it was
// sent.
func TestLazyHoldHostileRequests(t *testing.T) {
	t.Parallel()
	n := newLazyNode(t)
	ctx := context.Background()
	id, dir := n.layer('c')
	if err := shim.HoldLazyLayer(ctx, n.binary, n.shims, id, dir, openFuse(t)); err != nil {
		t.Fatal(err)
	}
	keeper, monitor := n.shim("keeper"), n.shim("monitor")
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(n.nodeDir(), "node.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	call := func(req *proto.Request, oob []byte) *proto.Response {
		t.Helper()
		var b bytes.Buffer
		if err := proto.WriteRequest(&b, req); err != nil {
			t.Fatal(err)
		}
		if _, _, err := conn.WriteMsgUnix(b.Bytes(), oob, nil); err != nil {
			t.Fatal(err)
		}
		resp, err := proto.ReadResponse(conn)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := call(&proto.Request{Op: proto.OpLazyList}, nil); resp.Err() != nil || !slices.Equal(resp.IDs, []string{id}) {
		t.Fatalf("list: %+v", resp)
	}
	// What the requests send: /dev/fuse and /dev/null (the monitor's
	// stdio is /dev/null too). Counted by kind, not in all: the monitor
	// may still be closing the connection of the hold above.
	sent := func() [2]int { return [2]int{fdsOn(t, monitor, "/dev/fuse"), fdsOn(t, monitor, os.DevNull)} }
	baseline := sent()
	fd := func(f *os.File) int { return int(f.Fd()) }
	fuse1, fuse2 := fd(openFuse(t)), fd(openFuse(t))
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	many := make([]int, 12)
	for i := range many {
		many[i] = int(null.Fd())
	}
	otherID, otherDir := n.layer('d')
	hold := func(id, dir string) *proto.Request { return &proto.Request{Op: proto.OpLazyHold, ID: id, Dir: dir} }
	for _, tc := range []struct {
		name string
		req  *proto.Request
		oob  []byte
		want string
	}{
		{"no fd", hold(otherID, otherDir), nil, "carries no fd"},
		{"two fds", hold(otherID, otherDir), syscall.UnixRights(fuse1, fuse2), "fds or more"},
		{"two control messages", hold(otherID, otherDir), append(syscall.UnixRights(fuse1), syscall.UnixRights(fuse2)...), "fds or more"},
		{"twelve fds", hold(otherID, otherDir), syscall.UnixRights(many...), "fds or more"},
		{"not /dev/fuse", hold(otherID, otherDir), syscall.UnixRights(int(null.Fd())), "not a /dev/fuse connection"},
		{"bad chain ID", hold("sha256:"+strings.Repeat("z", 64), otherDir), syscall.UnixRights(fuse1), "chain ID"},
		{"relative dir", hold(otherID, "layers/d"), syscall.UnixRights(fuse1), "layer dir"},
		{"unclean dir", hold(otherID, otherDir+"/.."), syscall.UnixRights(fuse1), "layer dir"},
		{"an fd on another op", &proto.Request{Op: proto.OpLazyList}, syscall.UnixRights(fuse1), "carries an fd"},
	} {
		resp := call(tc.req, tc.oob)
		if resp.Kind != proto.KindInvalidArgument || !strings.Contains(resp.Error, tc.want) {
			t.Errorf("%s: %+v, want InvalidArgument saying %q", tc.name, resp, tc.want)
		}
		if c := sent(); c != baseline {
			t.Errorf("%s: the monitor has %d /dev/fuse and %d /dev/null fds, %d and %d before", tc.name, c[0], c[1], baseline[0], baseline[1])
		}
	}
	if ids := n.held(ctx); !slices.Equal(ids, []string{id}) {
		t.Fatalf("held after the hostile requests: %v, want [%s]", ids, id)
	}
	// One: the first (on its way, maybe); a second would never go.
	waitFor(t, "the keeper to hold the one connection", func() bool { return fuseFds(t, keeper) == 1 })
	if err := shim.DropLazyLayer(ctx, n.shims, id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to end", func() bool { return len(n.pids()) == 0 })
}

// A server that cannot live (a crash loop: five deaths, none living
// 10 s) makes the keeper give its layers up; it tells the monitor, which
// lists them no more and, holding nothing else, ends the node.
func TestLazyLayerGivenUpIsForgotten(t *testing.T) {
	t.Parallel()
	n := newLazyNodeServing(t, "exit 3")
	ctx := context.Background()
	id, dir := n.layer('f')
	if err := shim.HoldLazyLayer(ctx, n.binary, n.shims, id, dir, openFuse(t)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the keeper to give up and the node to end", func() bool { return len(n.pids()) == 0 })
	if got := len(n.servers()); got != 5 {
		t.Fatalf("%d server starts, want 5", got)
	}
	if ids := n.held(ctx); len(ids) != 0 {
		t.Fatalf("held after the keeper gave up: %v", ids)
	}
}
