// Command berthctl administers a running berthd over its socket.
//
//	berthctl [--address unix:///run/berth/berth.sock] image import FILE
//	berthctl [--address …] image export IMAGE FILE
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

	"github.com/berthcri/berth/internal/admin"
	"github.com/berthcri/berth/internal/config"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("berthctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := os.Getenv("BERTH_ADDRESS")
	if addr == "" {
		addr = config.DefaultListen
	}
	fs.StringVar(&addr, "address", addr, "berthd endpoint (unix:///path); env BERTH_ADDRESS")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: berthctl [--address ADDR] image import FILE\n       berthctl [--address ADDR] image export IMAGE FILE\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if len(rest) < 2 || rest[0] != "image" {
		fs.Usage()
		return 2
	}
	if !strings.HasPrefix(addr, "unix://") {
		fmt.Fprintf(stderr, "berthctl: --address %q: only unix:///path endpoints are supported\n", addr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(stderr, "berthctl: connect %s: %v\n", addr, err)
		return 1
	}
	defer conn.Close()

	switch {
	case rest[1] == "import" && len(rest) == 3:
		err = importImage(ctx, conn, rest[2], stdin, stdout)
	case rest[1] == "export" && len(rest) == 4:
		err = exportImage(ctx, conn, rest[2], rest[3], stdout)
	default:
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "berthctl: %v\n", err)
		return 1
	}
	return 0
}

func importImage(ctx context.Context, conn *grpc.ClientConn, file string, stdin io.Reader, stdout io.Writer) error {
	r := stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		defer f.Close()
		r = f
	}
	res, err := admin.ImportImage(ctx, conn, r)
	if err != nil {
		return fmt.Errorf("import %s: %w", file, err)
	}
	for _, v := range res.GetFields()["images"].GetListValue().GetValues() {
		img := v.GetStructValue().GetFields()
		var tags []string
		for _, t := range img["repoTags"].GetListValue().GetValues() {
			tags = append(tags, t.GetStringValue())
		}
		fmt.Fprintf(stdout, "imported %s %s\n", img["id"].GetStringValue(), strings.Join(tags, " "))
	}
	return nil
}

func exportImage(ctx context.Context, conn *grpc.ClientConn, ref, file string, stdout io.Writer) error {
	if file == "-" {
		return admin.ExportImage(ctx, conn, ref, stdout)
	}
	// Write beside the target and rename, so a failed export leaves no file.
	tmp := file + ".partial"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	err = admin.ExportImage(ctx, conn, ref, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("export %s: %w", ref, err)
	}
	return nil
}
