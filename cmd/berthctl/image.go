package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"

	"github.com/berthcri/berth/internal/admin"
)

// imageCommand runs `berthctl image import FILE`, `image export IMAGE
// FILE` and `image convert --estargz SRC DST`.
func imageCommand(ctx context.Context, g *globals, args []string) error {
	switch {
	case len(args) > 0 && args[0] == "convert":
		return convertCommand(ctx, g, args[1:])
	case len(args) == 2 && args[0] == "import":
		conn, err := g.dial()
		if err != nil {
			return err
		}
		defer conn.Close()
		return importImage(ctx, conn, args[1], g.stdin, g.stdout)
	case len(args) == 3 && args[0] == "export":
		conn, err := g.dial()
		if err != nil {
			return err
		}
		defer conn.Close()
		return exportImage(ctx, conn, args[1], args[2], g.stdout)
	}
	return errUsage
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
	// The archive holds every file of the image, which may be secret:
	// CreateTemp makes it 0600 (the umask may take more). Its fresh name
	// is made with O_EXCL, so a name planted in a shared dir (a symlink to
	// a file of root's) is never followed.
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".partial-*")
	if err != nil {
		return fmt.Errorf("export %s: %w", ref, err)
	}
	tmp := f.Name()
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
