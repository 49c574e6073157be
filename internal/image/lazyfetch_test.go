package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// gzipLayer is a gzip layer blob of n random bytes and its layerMeta
// (digest, size, diff ID).
func gzipLayer(t *testing.T, n int) ([]byte, layerMeta) {
	t.Helper()
	raw := make([]byte, n)
	rand.New(rand.NewSource(int64(n))).Read(raw)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	blob := buf.Bytes()
	sum, diff := sha256.Sum256(blob), sha256.Sum256(raw)
	return blob, layerMeta{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(blob)), DiffID: "sha256:" + hex.EncodeToString(diff[:])}
}

// TestBackgroundFetchResumesItsPartialBlob: a lazy layer's background
// fetch continues the partial blob in the layer's dir, asking the
// registry only for the rest, and still verifies the whole blob (digest
// and diff ID over the bytes on disk too). A partial blob that is not
// the blob's start (longer than the blob, or wrong bytes) is discarded
// and the blob fetched from its start, without calling the layer
// corrupt; a broken transfer keeps what arrived for the next try; a
// registry that ignores ranges gives the whole blob again.
func TestBackgroundFetchResumesItsPartialBlob(t *testing.T) {
	blob, lr := gzipLayer(t, 200_000)
	half := len(blob) / 2
	wrong := slices.Clone(blob[:half])
	wrong[half/2] ^= 0xff
	for _, tc := range []struct {
		name    string
		partial []byte // nil: no file
		whole   bool   // the registry ignores ranges
		breakAt int    // the first whole answer breaks after this many bytes
		// what the first try does: fails (and keeps keep bytes) or not
		firstFails bool
		keep       int
		asked      []int64 // the ranges asked for, over both tries
		wholes     int     // the whole-blob requests, over both tries
	}{
		{name: "nothing on disk", wholes: 1},
		{name: "half on disk", partial: blob[:half], asked: []int64{int64(half)}},
		{name: "all on disk", partial: blob},
		{name: "longer than the blob", partial: append(slices.Clone(blob), 0), wholes: 1},
		{name: "wrong bytes on disk", partial: wrong, firstFails: true, keep: -1, asked: []int64{int64(half)}, wholes: 1},
		{name: "registry ignores ranges", partial: blob[:half], whole: true, asked: []int64{int64(half)}},
		{name: "transfer breaks", breakAt: 70_000, firstFails: true, keep: 70_000, asked: []int64{70_000}, wholes: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, dir := newTestStore(t, Options{})
			partial := filepath.Join(t.TempDir(), PartialBlobFile)
			if tc.partial != nil {
				if err := os.WriteFile(partial, tc.partial, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			src := &fakeRanges{blob: blob, whole: tc.whole, breakAt: tc.breakAt}
			fetch := func() (int64, error) {
				return s.fetchWholeBlob(context.Background(), lr, src, time.Minute, partial)
			}
			if tc.firstFails {
				_, err := fetch()
				if err == nil || errors.Is(err, errCorruptBlob) {
					t.Fatalf("first try: %v, want a failure that is retried", err)
				}
				st, serr := os.Stat(partial)
				switch {
				case tc.keep < 0 && serr == nil:
					t.Fatalf("first try kept the partial blob (%d bytes): %v", st.Size(), err)
				case tc.keep >= 0 && (serr != nil || st.Size() != int64(tc.keep)):
					t.Fatalf("first try: partial blob %v %v, want %d bytes kept", st, serr, tc.keep)
				}
				if s.content.has(lr.Digest) {
					t.Fatal("a failed try stored the blob")
				}
			}
			unpacked, err := fetch()
			if err != nil {
				t.Fatal(err)
			}
			if unpacked != 200_000 || !s.content.has(lr.Digest) {
				t.Fatalf("unpacked %d, stored %v", unpacked, s.content.has(lr.Digest))
			}
			if _, err := os.Stat(partial); !os.IsNotExist(err) {
				t.Fatalf("partial blob left after the commit: %v", err)
			}
			if !slices.Equal(src.asked, tc.asked) || src.wholes != tc.wholes {
				t.Fatalf("ranges asked %v, whole requests %d; want %v, %d", src.asked, src.wholes, tc.asked, tc.wholes)
			}
			if left := storeLeftovers(t, dir); len(left) != 1 {
				t.Fatalf("store holds %v", left)
			}
		})
	}
}

// TestBackgroundFetchCorruptFromItsStart: bytes from the registry that
// are not the image's, fetched from the start, are corrupt (not
// retried), and leave no partial blob.
func TestBackgroundFetchCorruptFromItsStart(t *testing.T) {
	blob, lr := gzipLayer(t, 50_000)
	bad := slices.Clone(blob)
	bad[len(bad)/2] ^= 0xff
	s, dir := newTestStore(t, Options{})
	partial := filepath.Join(t.TempDir(), PartialBlobFile)
	_, err := s.fetchWholeBlob(context.Background(), lr, &fakeRanges{blob: bad}, time.Minute, partial)
	if !errors.Is(err, errCorruptBlob) {
		t.Fatalf("corrupt blob: %v", err)
	}
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Fatalf("partial blob of a corrupt layer kept: %v", err)
	}
	if left := storeLeftovers(t, dir); len(left) != 0 {
		t.Fatalf("store holds %v", left)
	}
}

// TestBackgroundFetchResumesItsRangedBlob: a large blob fetched in
// ranges records the prefix it wrote beside the partial blob (its file
// is sized at once, so its size says nothing); a fetch broken part-way
// resumes at the last chunk recorded, asking for none before it, and
// verifies the whole blob. A partial blob of the blob's size without a
// record is taken as written in order, fails verification, and is
// fetched again from the start.
func TestBackgroundFetchResumesItsRangedBlob(t *testing.T) {
	blob, lr := gzipLayer(t, 100_000)
	set := RangeFetch{MinSize: 1000, ChunkSize: 10_000, Parallel: 1}
	chunksFrom := func(off int64) []int64 {
		var starts []int64
		for ; off < lr.Size; off = (off/set.ChunkSize + 1) * set.ChunkSize {
			starts = append(starts, off)
		}
		return starts
	}
	fetch := func(s *Store, src blobOpener, partial string) (int64, error) {
		return s.fetchWholeBlob(context.Background(), lr, src, time.Minute, partial)
	}

	t.Run("broken, then resumed", func(t *testing.T) {
		s, dir := newTestStore(t, Options{})
		partial := filepath.Join(t.TempDir(), PartialBlobFile)
		broke := false
		src := &fakeRanges{blob: blob, set: set, cut: func(start, _ int64, body []byte) []byte {
			if start == 50_000 && !broke {
				broke = true
				return body[:1234]
			}
			return body
		}}
		if _, err := fetch(s, src, partial); err == nil || errors.Is(err, errCorruptBlob) {
			t.Fatalf("first try: %v, want a failure that is retried", err)
		}
		if data, err := os.ReadFile(partial + ".prefix"); err != nil || string(data) != "50000\n" {
			t.Fatalf("prefix recorded: %q %v, want 50000", data, err)
		}
		first := len(src.asked)
		if _, err := fetch(s, src, partial); err != nil {
			t.Fatal(err)
		}
		if got, want := src.asked[first:], chunksFrom(50_000); !slices.Equal(got, want) {
			t.Fatalf("second try asked for %v, want %v", got, want)
		}
		for _, p := range []string{partial, partial + ".prefix"} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Fatalf("%s left after the commit: %v", p, err)
			}
		}
		if !s.content.has(lr.Digest) || len(storeLeftovers(t, dir)) != 1 || src.wholes != 0 {
			t.Fatalf("stored %v, store holds %v, whole requests %d", s.content.has(lr.Digest), storeLeftovers(t, dir), src.wholes)
		}
	})
	t.Run("recorded mid-chunk", func(t *testing.T) {
		s, _ := newTestStore(t, Options{})
		partial := filepath.Join(t.TempDir(), PartialBlobFile)
		file := append(slices.Clone(blob[:35_000]), make([]byte, len(blob)-35_000)...)
		if err := os.WriteFile(partial, file, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(partial+".prefix", []byte("35000\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		src := &fakeRanges{blob: blob, set: set}
		if _, err := fetch(s, src, partial); err != nil {
			t.Fatal(err)
		}
		if want := chunksFrom(35_000); !slices.Equal(src.asked, want) {
			t.Fatalf("asked for %v, want %v", src.asked, want)
		}
	})
	t.Run("no record", func(t *testing.T) {
		s, _ := newTestStore(t, Options{})
		partial := filepath.Join(t.TempDir(), PartialBlobFile)
		file := append(slices.Clone(blob[:35_000]), make([]byte, len(blob)-35_000)...)
		if err := os.WriteFile(partial, file, 0o600); err != nil {
			t.Fatal(err)
		}
		src := &fakeRanges{blob: blob, set: set}
		if _, err := fetch(s, src, partial); err == nil || errors.Is(err, errCorruptBlob) {
			t.Fatalf("first try: %v, want a failure that is retried", err)
		}
		if _, err := os.Stat(partial); !os.IsNotExist(err) {
			t.Fatalf("a partial blob that failed verification kept: %v", err)
		}
		if _, err := fetch(s, src, partial); err != nil {
			t.Fatal(err)
		}
		if want := chunksFrom(0); !slices.Equal(src.asked, want) || !s.content.has(lr.Digest) {
			t.Fatalf("asked for %v, want %v", src.asked, want)
		}
	})
}

// TestBackgroundFetchHostilePartialBlob: what stands at the partial
// blob's or its prefix record's name and is not theirs (a link to a
// file elsewhere, a dir, a FIFO, a record of a MiB) is removed or
// ignored, never followed or read whole, and the blob is fetched.
func TestBackgroundFetchHostilePartialBlob(t *testing.T) {
	blob, lr := gzipLayer(t, 60_000)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, partial, outside string)
	}{
		{"link", func(t *testing.T, partial, outside string) {
			if err := os.Symlink(outside, partial); err != nil {
				t.Fatal(err)
			}
		}},
		{"dir", func(t *testing.T, partial, _ string) {
			if err := os.MkdirAll(filepath.Join(partial, "sub"), 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo", func(t *testing.T, partial, _ string) {
			if err := unix.Mkfifo(partial, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"fifo record", func(t *testing.T, partial, _ string) {
			if err := unix.Mkfifo(partial+".prefix", 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"long record", func(t *testing.T, partial, _ string) {
			if err := os.WriteFile(partial+".prefix", bytes.Repeat([]byte("1"), 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"record past the blob", func(t *testing.T, partial, _ string) {
			if err := os.WriteFile(partial+".prefix", []byte("9999999\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t, Options{})
			dir := t.TempDir()
			partial, outside := filepath.Join(dir, PartialBlobFile), filepath.Join(dir, "outside")
			if err := os.WriteFile(outside, []byte("not the blob's"), 0o600); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, partial, outside)
			src := &fakeRanges{blob: blob}
			var err error
			for range 2 { // a bad partial blob costs one try
				if _, err = s.fetchWholeBlob(context.Background(), lr, src, time.Minute, partial); err == nil {
					break
				}
			}
			if err != nil || !s.content.has(lr.Digest) {
				t.Fatalf("fetch: %v, stored %v", err, s.content.has(lr.Digest))
			}
			if got, _ := os.ReadFile(outside); string(got) != "not the blob's" {
				t.Fatalf("the file a link pointed to was written: %q", got)
			}
		})
	}
}
