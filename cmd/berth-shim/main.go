// Command berth-shim is berth's container monitor, one pair of processes
// per node (decision 1701):
//
//	berth-shim keeper --dir <shims>/.node    started by berthd
//	berth-shim monitor --dir <shims>/.node   started by the keeper
//
// The keeper is the child subreaper every container init reparents to: it
// reaps them, keeps a copy of their stdio and restarts the monitor if it
// dies. The monitor serves every pod on the pod's socket: it creates the
// containers through the OCI runtime, writes their CRI logs and persists
// their exits. Both outlive berthd; they exit when the node has no pod.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/fdsafe"
	"github.com/berthcri/berth/internal/shim/keeper"
	"github.com/berthcri/berth/internal/shim/monitor"
	"github.com/berthcri/berth/internal/shim/proto"
)

func main() {
	// The descriptors the keeper and the monitor are handed (readiness
	// pipe, launch lock, the monitor's link to the keeper) and anything
	// else inherited stay theirs: no runc they start gets one.
	fdsafe.CloseOnExecFrom3()
	if len(os.Args) < 2 || (os.Args[1] != "keeper" && os.Args[1] != "monitor") {
		fmt.Fprintln(os.Stderr, "usage: berth-shim keeper|monitor --dir <shims>/.node")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet("berth-shim "+mode, flag.ExitOnError)
	dir := fs.String("dir", "", "the node's shim directory (<state>/shims/.node)")
	_ = fs.Parse(os.Args[2:])
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "berth-shim: --dir is required")
		os.Exit(2)
	}
	// Lean by design: one P. The GC keeps its default pace; the monitor
	// collects and returns memory itself once it grew (decision 1700). No
	// memory limit: the limit counts the runtime's own mapped metadata
	// (several MiB here, mostly never touched), so any limit small enough
	// to matter keeps the GC running non-stop.
	runtime.GOMAXPROCS(1)
	// berthd's terminal or session going away is not our business.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)

	if err := os.MkdirAll(*dir, 0o700); err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim: %v\n", err)
		os.Exit(1)
	}
	logFile, err := os.OpenFile(filepath.Join(*dir, "shim.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim: %v\n", err)
		os.Exit(1)
	}
	pid := os.Getpid()
	logf := func(format string, args ...any) {
		fmt.Fprintf(logFile, "%s %s[%d] %s\n", time.Now().UTC().Format(time.RFC3339Nano), mode, pid, fmt.Sprintf(format, args...))
	}
	if mode == "keeper" {
		os.Exit(runKeeper(*dir, logf))
	}
	os.Exit(runMonitor(*dir, logf))
}

func runKeeper(dir string, logf func(string, ...any)) int {
	// Container inits reparent to us when the runtime's create exits.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		logf("set child subreaper: %v", err)
		return 1
	}
	// The monitor is started again from this path, so an upgraded binary
	// in its place takes over at the monitor's next start.
	binary, err := os.Executable()
	if err != nil {
		logf("find own binary: %v", err)
		return 1
	}
	// Held until we exit: berthd's launch finding no monitor but this
	// lock held waits for the monitor we restart instead of starting a
	// second keeper on the dir.
	keeperLock, err := keeper.HoldKeeperLock(dir)
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer keeperLock.Close()
	// The launch lock goes to the first monitor and nowhere else: not to
	// the monitors started after it, nor to anything they start.
	unix.CloseOnExec(keeper.KeeperLaunchLockFd)
	return keeper.New(dir, binary, logf).Run(os.NewFile(keeper.ReadyFd, "ready"), os.NewFile(keeper.KeeperLaunchLockFd, "launch.lock"))
}

func runMonitor(dir string, logf func(string, ...any)) int {
	// The link to the keeper is the monitor's alone: no runtime it runs
	// may hold it, so that it ends when the monitor does and the keeper,
	// reading it to its end, knows all the monitor said (keeper.Run).
	unix.CloseOnExec(keeper.LinkFd)
	m := monitor.New(dir, logf, keeper.LinkFd)
	// Adopt, then Listen: berthd takes a ping on node.sock that does not
	// name a pod as "this pod was not adopted, its containers are lost"
	// (shim.Client.podServed), so node.sock must not answer before every
	// container the keeper holds is adopted.
	if err := m.Adopt(); err != nil {
		logf("%v", err)
		return 1
	}
	if err := m.Listen(); err != nil {
		logf("%v", err)
		return 1
	}
	// Let go of the launch lock (the first monitor's: berthd's; a
	// restarted one's /dev/null), then tell berthd we listen (fd 3: its
	// readiness pipe, or /dev/null) and let go of that too. In this order,
	// whoever waited for the lock finds the monitor listening.
	unix.Close(keeper.MonitorLaunchLockFd)
	if ready := os.NewFile(keeper.ReadyFd, "ready"); ready != nil {
		_, _ = ready.Write([]byte{1})
		ready.Close()
	}
	logf("listening")
	// SIGTERM is a hand-over (an upgrade: install the new binary in
	// place, then signal the monitor): the keeper starts the binary at
	// its path at once, which adopts every container.
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	go func() {
		<-terms
		logf("SIGTERM: handing over to a new monitor")
		m.HandOver(2 * time.Second)
		os.Exit(proto.MonitorHandedOver)
	}()
	m.Serve()
	logf("no pods left; exiting")
	return 0
}
