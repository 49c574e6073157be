package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// smallImage is one tiny layer, for import seeds and tests.
func smallImage(tb testing.TB) v1.Image {
	tb.Helper()
	l, err := testimages.Layer([]testimages.File{{Name: "etc/", Dir: true}, {Name: "etc/hello", Data: []byte("hello\n")}})
	if err != nil {
		tb.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		tb.Fatal(err)
	}
	return img
}

func dockerArchive(tb testing.TB, img v1.Image) []byte {
	tb.Helper()
	tag, err := name.NewTag("example.com/fuzz/img:v1")
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func ociArchive(tb testing.TB, img v1.Image) []byte {
	tb.Helper()
	dir := tb.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err = filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	tw.Close()
	return buf.Bytes()
}

// rewriteArchive returns archive with the file name's content replaced
// by fn's.
func rewriteArchive(tb testing.TB, archive []byte, name string, fn func([]byte) []byte) []byte {
	tb.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if h.Name == name {
			data = fn(data)
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return out.Bytes()
}

// TestImportRefusesOversizedJSON: manifest.json, a config or index.json
// over their limits are refused from their tar headers, before
// go-containerregistry reads them whole.
func TestImportRefusesOversizedJSON(t *testing.T) {
	requireRoot(t)
	img := smallImage(t)
	cfgName, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	pad := func(limit int) func([]byte) []byte {
		return func(b []byte) []byte { return append(b, bytes.Repeat([]byte(" "), limit)...) }
	}
	for _, tc := range []struct {
		name    string
		archive []byte
	}{
		{"docker manifest.json", rewriteArchive(t, dockerArchive(t, img), "manifest.json", pad(maxImportJSON))},
		{"docker config", rewriteArchive(t, dockerArchive(t, img), cfgName.String(), pad(maxConfigSize))},
		{"oci index.json", rewriteArchive(t, ociArchive(t, img), "index.json", pad(maxImportJSON))},
		{"oci config", rewriteArchive(t, ociArchive(t, img), "blobs/sha256/"+cfgName.Hex, pad(maxConfigSize))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images")})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Import(context.Background(), bytes.NewReader(tc.archive))
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("import: %v, want ResourceExhausted", err)
			}
		})
	}
}

// FuzzImportArchive feeds arbitrary archives to the docker-archive and
// OCI layout importer. Invariants: no panic, nothing outside the store
// root, and a failed import leaves nothing in ingest/.
func FuzzImportArchive(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("import unpacks layers: needs root")
	}
	img := smallImage(f)
	f.Add(dockerArchive(f, img))
	f.Add(ociArchive(f, img))
	f.Add(rewriteArchive(f, dockerArchive(f, img), "manifest.json", func(b []byte) []byte {
		return []byte(strings.Replace(string(b), `"Config":"`, `"Config":"../../`, 1))
	}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, archive []byte) {
		outer := t.TempDir()
		root := filepath.Join(outer, "images")
		s, err := Open(Options{Root: root, Limits: Limits{MaxLayerSize: 4 << 20, MaxImageSize: 8 << 20, MaxLayerEntries: 1000, MaxLayerDirs: 200}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = s.Import(ctx, bytes.NewReader(archive))
		if es, _ := os.ReadDir(outer); len(es) != 1 {
			t.Fatalf("the store's parent holds %d entries, want 1", len(es))
		}
		if err != nil {
			s.WaitGC()
			if es, _ := os.ReadDir(filepath.Join(root, "ingest")); len(es) != 0 {
				t.Fatalf("failed import (%v) left %d entries in ingest/", err, len(es))
			}
		}
	})
}
