package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func newTestContent(t *testing.T) *contentStore {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"blobs/sha256", "ingest"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return &contentStore{dir: dir}
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func ingestLeft(t *testing.T, c *contentStore) int {
	t.Helper()
	es, err := os.ReadDir(c.path("ingest"))
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestIngestCommitsOnlyVerifiedBlobs: a blob becomes visible only when it
// had its size and digest; a refused one is removed by abort.
func TestIngestCommitsOnlyVerifiedBlobs(t *testing.T) {
	data := []byte("layer bytes")
	for _, tc := range []struct {
		name   string
		write  []byte
		size   int64
		tamper func(string) string
		ok     bool
	}{
		{"whole", data, int64(len(data)), nil, true},
		{"short", data[:4], int64(len(data)), nil, false},
		{"other content", []byte("LAYER BYTES"), int64(len(data)), nil, false},
		{"digest fault", data, int64(len(data)), func(string) string { return "sha256:bad" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestContent(t)
			d := digestOf(data)
			in, err := c.newIngest(d)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := in.Write(tc.write); err != nil {
				t.Fatal(err)
			}
			err = in.commit("layer", tc.size, tc.tamper)
			in.abort()
			if tc.ok {
				if err != nil || !c.has(d) {
					t.Fatalf("commit: %v, stored %v", err, c.has(d))
				}
			} else if !errors.Is(err, errdefs.ErrInvalidArgument) || c.has(d) {
				t.Fatalf("commit of a bad blob: %v, stored %v", err, c.has(d))
			}
			if n := ingestLeft(t, c); n != 0 {
				t.Fatalf("%d files left in ingest/", n)
			}
		})
	}
}

func TestWriteBlobChecksTheDigest(t *testing.T) {
	c := newTestContent(t)
	data := []byte(`{"config":true}`)
	if err := c.writeBlob(digestOf([]byte("other")), data); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("blob under a wrong digest: %v", err)
	}
	d := digestOf(data)
	if err := c.writeBlob(d, data); err != nil {
		t.Fatal(err)
	}
	if got, err := c.read(d); err != nil || string(got) != string(data) {
		t.Fatalf("read back %q, %v", got, err)
	}
	if n := ingestLeft(t, c); n != 0 {
		t.Fatalf("%d files left in ingest/", n)
	}
}
