// Command berth-lazy is the node's lazy-layer server (decision 3600, S4):
// the node's keeper starts it, and starts it again when it dies, on the
// link it reads (fd 3); each lazy-hold message there hands it a lazy
// layer's FUSE connection and dir, which it serves until a lazy-drop.
// It is a binary of its own so that the keeper and monitor (berth-shim)
// do not carry the lazy layers' code and memory on every node.
//
//	berth-lazy [--log FILE]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/berthcri/berth/internal/fdsafe"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
)

// linkFd is the keeper's link.
const linkFd = 3

func main() {
	fdsafe.CloseOnExecFrom3()
	logPath := flag.String("log", "", "append the log to this file (default: stderr)")
	flag.Parse()
	// The keeper's session or terminal going away is not our business.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	var w io.Writer = os.Stderr
	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			fmt.Fprintf(os.Stderr, "berth-lazy: %v\n", err)
			os.Exit(1)
		}
		w = f
	}
	log := slog.New(slog.NewTextHandler(w, nil)).With("pid", os.Getpid())
	srv := lazysrv.New(lazysrv.DefaultOptions(log))
	log.Info("lazy-layer server started")
	if err := srv.Run(context.Background(), linkFd); err != nil {
		log.Error("lazy-layer server", "error", err)
		os.Exit(1)
	}
	log.Info("keeper link ended; exiting", "layers", srv.Count())
}
