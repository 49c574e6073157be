package main

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthcri/berth/internal/admin"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/image/estargzconv"
)

// storePrefix names an image in berthd's store rather than a registry.
const storePrefix = "store:"

// maxPrioritizeFile bounds --prioritize-file: a list of paths, read whole.
const maxPrioritizeFile = 4 << 20

// convertCommand runs `berthctl image convert --estargz [flags] SRC DST`
// (decision 3600). SRC and DST are registry references, or store:REF for
// an image in berthd's store (read through its export, written through
// its import as an OCI layout, which keeps the layer annotations).
func convertCommand(ctx context.Context, g *globals, args []string) error {
	fs := flag.NewFlagSet("image convert", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	esgz := fs.Bool("estargz", false, "convert to eStargz (the only format so far)")
	prioritize := fs.String("prioritize", "", "comma-separated files read first at start")
	prioritizeFile := fs.String("prioritize-file", "", "file listing files read first at start, one per line")
	chunkSize := fs.Int("chunk-size", 0, "largest chunk of a file in bytes (0: 4 MiB)")
	maxLayer := fs.Int64("max-layer-size", estargzconv.DefaultMaxLayerSize, "refuse a layer whose tar is larger (bytes)")
	plainHTTP := fs.Bool("plain-http", false, "talk plain HTTP to the registries (loopback and private addresses always may)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 2 || !*esgz {
		return errUsage
	}
	src, dst := fs.Arg(0), fs.Arg(1)
	prio, err := prioritized(*prioritize, *prioritizeFile)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "berthctl-convert-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	img, err := readSource(ctx, g, src, tmp, *plainHTTP)
	if err != nil {
		return fmt.Errorf("convert %s: %w", src, err)
	}
	res, err := estargzconv.Convert(ctx, img, estargzconv.Options{
		Prioritized: prio, ChunkSize: *chunkSize, MaxLayerSize: *maxLayer, TempDir: tmp,
	})
	if err != nil {
		return fmt.Errorf("convert %s: %w", src, err)
	}
	for _, p := range res.MissedPrioritized {
		fmt.Fprintf(g.stdout, "warning: %s is in no layer of %s\n", p, src)
	}
	if err := writeDest(ctx, g, res.Image, dst, tmp, *plainHTTP); err != nil {
		return fmt.Errorf("convert %s to %s: %w", src, dst, err)
	}
	d, err := res.Image.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "converted %s to %s@%s\n", src, dst, d)
	return nil
}

// prioritized is the list of --prioritize and --prioritize-file.
func prioritized(list, file string) ([]string, error) {
	var out []string
	for p := range strings.SplitSeq(list, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	if file == "" {
		return out, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxPrioritizeFile+1))
	n := 0
	for sc.Scan() {
		n += len(sc.Bytes()) + 1
		if p := strings.TrimSpace(sc.Text()); p != "" && !strings.HasPrefix(p, "#") {
			out = append(out, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--prioritize-file %s: %w", file, err)
	}
	if n > maxPrioritizeFile {
		return nil, fmt.Errorf("--prioritize-file %s: over %d bytes", file, maxPrioritizeFile)
	}
	return out, nil
}

func registryRef(ref string, plainHTTP bool) (name.Reference, error) {
	var opts []name.Option
	if plainHTTP {
		opts = append(opts, name.Insecure)
	}
	return name.ParseReference(ref, opts...)
}

// readSource opens src: an image of berthd's store, exported into dir, or
// one of a registry (the linux/GOARCH image of an index).
func readSource(ctx context.Context, g *globals, src, dir string, plainHTTP bool) (v1.Image, error) {
	if ref, ok := strings.CutPrefix(src, storePrefix); ok {
		conn, err := g.dial()
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		archive := filepath.Join(dir, "source.tar")
		f, err := os.OpenFile(archive, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, err
		}
		err = admin.ExportImage(ctx, conn, ref, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("export from the store: %w", err)
		}
		return tarball.ImageFromPath(archive, nil)
	}
	r, err := registryRef(src, plainHTTP)
	if err != nil {
		return nil, err
	}
	return remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
}

// writeDest pushes img to dst, or imports it into berthd's store as an
// OCI layout tarball written in dir.
func writeDest(ctx context.Context, g *globals, img v1.Image, dst, dir string, plainHTTP bool) error {
	ref, ok := strings.CutPrefix(dst, storePrefix)
	if !ok {
		r, err := registryRef(dst, plainHTTP)
		if err != nil {
			return err
		}
		return remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	n, err := image.ParseReference(ref)
	if err != nil {
		return err
	}
	lay := filepath.Join(dir, "layout")
	p, err := layout.Write(lay, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": n.String()})); err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	conn, err := g.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(lay, pw)) }()
	_, err = admin.ImportImage(ctx, conn, pr)
	pr.CloseWithError(errors.New("import ended"))
	if err != nil {
		return fmt.Errorf("import into the store: %w", err)
	}
	return nil
}

// tarDir writes the regular files and directories under root as a tar.
func tarDir(root string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() && !info.IsDir() {
			return fmt.Errorf("%s: not a file or directory", p)
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
