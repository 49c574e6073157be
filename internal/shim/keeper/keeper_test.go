package keeper

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// linked returns a keeper whose monitor link is one end of a socketpair,
// and a reader of the other end (the monitor's).
func linked(t *testing.T) (*Keeper, *proto.KeeperReader) {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(sp[0]); unix.Close(sp[1]) })
	k := New(t.TempDir(), "berth-shim", t.Logf)
	k.link = sp[0]
	return k, proto.NewKeeperReader(sp[1])
}

func pipeFds(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

func dup(t *testing.T, f *os.File) int {
	t.Helper()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// An init that dies before its register arrives (a restored container
// whose process exits at once) is reaped as an orphan; the register then
// finds its exit and tells the monitor.
func TestExitBeforeRegisterIsDelivered(t *testing.T) {
	k, mon := linked(t)
	k.reapedLocked(4242, unix.WaitStatus(3<<8))
	outR, _ := pipeFds(t)
	k.applyLocked(&proto.KeeperMsg{Op: proto.KeeperRegister, ID: "c1", Dir: "/d", Pid: 4242, Streams: "stdout"}, []int{dup(t, outR)})
	m, _, err := mon.Recv()
	if err != nil || m.Op != proto.KeeperExit || m.Pid != 4242 || unix.WaitStatus(m.Status).ExitStatus() != 3 {
		t.Fatalf("monitor got %+v, %v", m, err)
	}
	if e := k.ctrs["c1"]; e == nil || !e.msg.Exited {
		t.Fatalf("entry %+v", e)
	}
	if _, ok := k.unclaimed.Take(4242); ok {
		t.Fatal("the exit is still unclaimed")
	}
}

// close-stdin closes the keeper's copy of the stdin write end, so the
// container's reader sees EOF once the monitor's is closed too; forget
// drops every fd; a register whose fds do not match its streams is
// refused and its fds closed.
func TestStdinCustody(t *testing.T) {
	k, _ := linked(t)
	stdinR, stdinW := pipeFds(t)
	outR, _ := pipeFds(t)
	k.applyLocked(&proto.KeeperMsg{Op: proto.KeeperRegister, ID: "c1", Pid: 7, Streams: "stdout,stdin"}, []int{dup(t, outR), dup(t, stdinW)})
	stdinW.Close() // the monitor's end
	k.applyLocked(&proto.KeeperMsg{Op: proto.KeeperCloseStdin, ID: "c1"}, nil)
	if n, err := stdinR.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("stdin read after close-stdin: %d, %v (want EOF)", n, err)
	}
	k.applyLocked(&proto.KeeperMsg{Op: proto.KeeperForget, ID: "c1"}, nil)
	if len(k.ctrs) != 0 || len(k.byPid) != 0 {
		t.Fatalf("after forget: %d containers, %d pids", len(k.ctrs), len(k.byPid))
	}
	bad := dup(t, outR)
	k.applyLocked(&proto.KeeperMsg{Op: proto.KeeperRegister, ID: "c2", Pid: 8, Streams: "stdout,stderr"}, []int{bad})
	if len(k.ctrs) != 0 {
		t.Fatal("a register with too few fds was kept")
	}
	if _, err := unix.FcntlInt(uintptr(bad), unix.F_GETFD, 0); err == nil {
		t.Fatal("the refused register's fd is still open")
	}
}
