// Command berthctl administers a berth node: what crictl does not cover.
//
//	berthctl [--address ADDR] image import FILE     load a docker-archive or OCI layout tarball
//	berthctl [--address ADDR] image export IMAGE FILE
//	berthctl [--address ADDR] image convert --estargz [--prioritize F,…] [--prioritize-file FILE] SRC DST
//	                                                 rewrite an image into eStargz (lazy pulling); SRC and DST
//	                                                 are registry references or store:REF
//	berthctl [--address ADDR] info                   daemon version, config, counts, addresses
//	berthctl [--config FILE] doctor                  check the node before pointing the kubelet here
//
// FILE "-" means stdin or stdout. The address defaults to $BERTH_ADDRESS,
// then berthd's default socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berthcri/berth/internal/config"
)

const usage = `usage: berthctl [--address ADDR] image import FILE
       berthctl [--address ADDR] image export IMAGE FILE
       berthctl [--address ADDR] image convert --estargz [--prioritize F,...] [--prioritize-file FILE]
                [--chunk-size N] [--max-layer-size N] [--plain-http] SRC DST   (SRC, DST: registry ref or store:REF)
       berthctl [--address ADDR] info
       berthctl [--config FILE] doctor
`

// errUsage makes run print the usage and exit 2.
var errUsage = errors.New("usage")

// globals are the flags shared by every command.
type globals struct {
	address    string
	configPath string
	stdin      io.Reader
	stdout     io.Writer
}

func (g *globals) dial() (*grpc.ClientConn, error) {
	if !strings.HasPrefix(g.address, "unix://") {
		return nil, fmt.Errorf("--address %q: only unix:///path endpoints are supported", g.address)
	}
	conn, err := grpc.NewClient(g.address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", g.address, err)
	}
	return conn, nil
}

// errFailed reports a command that printed its own failure (doctor).
var errFailed = errors.New("failed")

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("berthctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	g := &globals{stdin: stdin, stdout: stdout}
	g.address = os.Getenv("BERTH_ADDRESS")
	if g.address == "" {
		g.address = config.DefaultListen
	}
	fs.StringVar(&g.address, "address", g.address, "berthd endpoint (unix:///path); env BERTH_ADDRESS")
	fs.StringVar(&g.configPath, "config", config.DefaultConfigPath, "berthd config file, for doctor")
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var err error
	switch rest[0] {
	case "image":
		err = imageCommand(ctx, g, rest[1:])
	case "info":
		err = infoCommand(ctx, g, rest[1:])
	case "doctor":
		err = doctorCommand(ctx, g, rest[1:])
	default:
		err = errUsage
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		fs.Usage()
		return 2
	case errors.Is(err, errFailed):
		return 1
	}
	fmt.Fprintf(stderr, "berthctl: %v\n", err)
	return 1
}
