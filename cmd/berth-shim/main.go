// Command berth-shim is berth's per-pod container monitor. berthd starts one
// per pod; it creates the pod's containers through the OCI runtime, holds
// their stdio, writes their CRI logs, reaps them and persists their exits.
// It outlives berthd and exits when its pod has no containers left.
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

	"github.com/berthcri/berth/internal/shim/server"
)

func main() {
	dir := flag.String("dir", "", "the shim's state directory (<state>/shims/<pod-id>)")
	pod := flag.String("pod", "", "the pod sandbox ID (for logs)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "berth-shim: --dir is required")
		os.Exit(2)
	}
	// Lean by design: one P. The GC keeps its default pace; the server
	// collects and returns memory itself once garbage piles up (see
	// server.trimMinGarbage). No memory limit: the limit counts the
	// runtime's own mapped metadata (several MiB here, mostly never
	// touched), so any limit small enough to matter keeps the GC running
	// non-stop.
	runtime.GOMAXPROCS(1)

	// Container inits reparent to us when the runtime's create exits.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "berth-shim: set child subreaper: %v\n", err)
		os.Exit(1)
	}
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
	logf := func(format string, args ...any) {
		fmt.Fprintf(logFile, "%s pod=%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), *pod, fmt.Sprintf(format, args...))
	}
	srv := server.NewServer(*dir, logf)
	if err := srv.Listen(); err != nil {
		logf("%v", err)
		os.Exit(1)
	}
	// Tell berthd we listen (fd 3 is its readiness pipe), then let go of
	// everything inherited.
	if ready := os.NewFile(3, "ready"); ready != nil {
		_, _ = ready.Write([]byte{1})
		ready.Close()
	}
	logf("listening")
	srv.Serve()
	logf("no containers left; exiting")
	logFile.Close()
}
