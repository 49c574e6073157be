package keeper

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// listenNode listens on the node dir's socket, as a monitor that has
// adopted does.
func listenNode(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := proto.WithShortPath(proto.NodeSocketPath(dir), func(p string) error {
		return unix.Bind(fd, &unix.SockaddrUnix{Name: p})
	}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		t.Fatal(err)
	}
}

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

// The watchdog (decision 3300) pings the monitor at each tick; one that
// said it serves and leaves a ping unanswered for hungAfter's ticks is
// killed; an answer in time resets the count; a monitor that never said
// it serves (still adopting) is killed only after adoptHungAfter's.
func TestWatchdogKillsOnlyAMonitorThatStoppedAnswering(t *testing.T) {
	ticks, adoptTicks := int(hungAfter/pingInterval), int(adoptHungAfter/pingInterval)
	for _, c := range []struct {
		name       string
		served     bool // the monitor's first pong came
		answerAt   int  // the tick after which it answers (-1: never)
		rounds     int  // ticks watched
		wantKilled bool
	}{
		{"hung", true, -1, ticks + 1, true},
		{"answers in time", true, ticks - 1, ticks + 1, false},
		{"still adopting, within its bound", false, -1, adoptTicks - 1, false},
		{"adopts in time", false, adoptTicks - 1, adoptTicks + 1, false},
		{"hung while adopting", false, -1, adoptTicks + 1, true},
		{"older monitor: listens, never pongs", false, -1, adoptTicks + 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			k, mon := linked(t)
			cmd := exec.Command("sleep", "100")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			if strings.HasPrefix(c.name, "older monitor") {
				listenNode(t, k.dir)
			}
			k.watchMonitor(cmd.Process.Pid, k.link)
			t.Cleanup(k.monitorReaped)
			if c.served {
				k.ponged()
			}
			now := time.Now()
			for i := 0; i <= c.rounds; i++ {
				k.checkMonitor(now.Add(time.Duration(i) * pingInterval))
				if i == c.answerAt {
					if m, _, err := mon.Recv(); err != nil || m.Op != proto.KeeperPing {
						t.Fatalf("monitor got %+v, %v; want a ping", m, err)
					}
					k.ponged()
				}
			}
			var ws syscall.WaitStatus
			flags := syscall.WNOHANG // not killed: still running
			if c.wantKilled {
				flags = 0 // killed: reaped at once (sleep would end only in 100 s)
			}
			pid, err := syscall.Wait4(cmd.Process.Pid, &ws, flags, nil)
			killed := err == nil && pid == cmd.Process.Pid && ws.Signaled() && ws.Signal() == syscall.SIGKILL
			if killed != c.wantKilled {
				t.Fatalf("killed %v (wait4: %d, %v, %v), want %v", killed, pid, ws, err, c.wantKilled)
			}
		})
	}
}
