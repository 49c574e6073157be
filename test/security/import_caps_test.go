package security

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berthcri/berth/internal/admin"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// TestImportHugeJSONRefused (issue 34 finding 5, CVE-2023-25153's class):
// `berthctl image import` of a docker-archive whose manifest.json, or
// whose config, is 32 MiB (padded with JSON whitespace) is refused with
// ResourceExhausted from the tar header, before it is read. On b407862
// both were read whole and imported.
func TestImportHugeJSONRefused(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	img := unpackImage(t, []string{"true"})
	tag, err := name.NewTag("example.com/hostile/import:v1")
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := tarball.Write(tag, img, &archive); err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"manifest.json", cfg.String()} {
		t.Run(file, func(t *testing.T) {
			padded := importPadEntry(t, archive.Bytes(), file, 32<<20)
			_, err := admin.ImportImage(berthdtest.Ctx(t), conn, bytes.NewReader(padded))
			berthdtest.WantCode(t, err, codes.ResourceExhausted)
		})
	}
}

// importPadEntry returns the archive with n bytes of JSON whitespace
// after the content of file.
func importPadEntry(t *testing.T, archive []byte, file string, n int) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == file {
			found = true
			data = append(data, bytes.Repeat([]byte("\n"), n)...)
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		t.Fatalf("%s is not in the archive", file)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
