package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Small chunks so that the test images' busybox layer (about 1 MiB) is
// fetched as many ranges.
var testRanges = RangeFetch{MinSize: 64 << 10, ChunkSize: 96 << 10, Parallel: 3, Retries: 3}

// fakeRanges serves blob from memory; cut, if set, may break or change a
// range's body (given the range asked for and its bytes).
type fakeRanges struct {
	blob  []byte
	set   RangeFetch
	whole bool  // answer every range with the whole blob (200)
	err   error // answer every range after the first with this error
	// breakAt, if set, breaks the next whole-blob answer after that many
	// bytes (then clears itself).
	breakAt int
	cut     func(start, end int64, body []byte) []byte

	mu     sync.Mutex
	asked  []int64 // the start of every range asked for
	wholes int     // whole-blob requests
}

func (f *fakeRanges) open(context.Context, layerMeta) (io.ReadCloser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wholes++
	if n := f.breakAt; n > 0 {
		f.breakAt = 0
		return io.NopCloser(io.MultiReader(bytes.NewReader(f.blob[:n]), iotest.ErrReader(io.ErrUnexpectedEOF))), nil
	}
	return io.NopCloser(bytes.NewReader(f.blob)), nil
}

func (f *fakeRanges) openRange(_ context.Context, _ layerMeta, start, end int64) (io.ReadCloser, bool, error) {
	f.mu.Lock()
	f.asked = append(f.asked, start)
	f.mu.Unlock()
	if f.whole {
		return io.NopCloser(bytes.NewReader(f.blob)), false, nil
	}
	if f.err != nil && start > 0 {
		return nil, false, f.err
	}
	body := f.blob[start:end]
	if f.cut != nil {
		body = f.cut(start, end, body)
	}
	return io.NopCloser(bytes.NewReader(body)), true, nil
}

func (f *fakeRanges) ranges() RangeFetch { return f.set }

func randomBlob(n int) ([]byte, layerMeta) {
	b := make([]byte, n)
	rand.New(rand.NewSource(int64(n))).Read(b)
	sum := sha256.Sum256(b)
	return b, layerMeta{Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(n)}
}

// fetchAll runs one blob fetch to its end as streamLayer does, reading
// the blob through it (as the unpacker would).
func fetchAll(t *testing.T, s *Store, lr layerMeta, open blobOpener) ([]byte, int64, error) {
	t.Helper()
	var count atomic.Int64
	bf, err := s.startBlobFetch(context.Background(), lr, open, &count)
	if err != nil {
		return nil, 0, err
	}
	defer bf.close()
	got, err := io.ReadAll(bf)
	return got, count.Load(), bf.finish(err)
}

func newTestStore(t *testing.T, opts Options) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "images")
	opts.Root = dir
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// TestRangeFetchReadsTheBlobInOrder fetches blobs of sizes around the chunk
// size in ranges: the reader sees the blob in order, every byte is counted
// once, and the blob is committed.
func TestRangeFetchReadsTheBlobInOrder(t *testing.T) {
	set := RangeFetch{MinSize: 1000, ChunkSize: 1000, Parallel: 3, Retries: 1}
	for _, n := range []int{1001, 2999, 3000, 12345} {
		s, dir := newTestStore(t, Options{})
		blob, lr := randomBlob(n)
		src := &fakeRanges{blob: blob, set: set}
		got, count, err := fetchAll(t, s, lr, src)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(got, blob) || count != int64(n) {
			t.Fatalf("%d bytes: read %d, counted %d", n, len(got), count)
		}
		if len(src.asked) != (n+999)/1000 {
			t.Fatalf("%d bytes: %d ranges asked for: %v", n, len(src.asked), src.asked)
		}
		if !s.content.has(lr.Digest) || len(storeLeftovers(t, dir)) != 1 {
			t.Fatalf("%d bytes: store holds %v", n, storeLeftovers(t, dir))
		}
	}
}

// TestRangeFetchVerifiesDigestAcrossRanges corrupts one byte in one range:
// the digest over the whole file refuses the blob and nothing is stored.
func TestRangeFetchVerifiesDigestAcrossRanges(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	blob, lr := randomBlob(10_000)
	src := &fakeRanges{blob: blob, set: RangeFetch{MinSize: 1000, ChunkSize: 1000, Parallel: 4}, cut: func(start, _ int64, body []byte) []byte {
		if start == 5000 {
			body = slices.Clone(body)
			body[17] ^= 1
		}
		return body
	}}
	_, _, err := fetchAll(t, s, lr, src)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "downloaded content has digest") {
		t.Fatalf("corrupt range: %v", err)
	}
	if left := storeLeftovers(t, dir); len(left) != 0 {
		t.Fatalf("a refused blob left %v", left)
	}
}

// TestRangeFetchResumesFromTheLastByte breaks ranges midway (their first
// answer ends early): each is asked for again from where it broke, and the
// blob arrives whole. A range that keeps breaking fails the fetch after
// its retries, leaving nothing.
func TestRangeFetchResumesFromTheLastByte(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	blob, lr := randomBlob(10_000)
	var mu sync.Mutex
	broken := map[int64]bool{}
	src := &fakeRanges{blob: blob, set: RangeFetch{MinSize: 1000, ChunkSize: 1000, Parallel: 3, Retries: 2}, cut: func(start, _ int64, body []byte) []byte {
		mu.Lock()
		defer mu.Unlock()
		if start%1000 == 0 && !broken[start] {
			broken[start] = true
			return body[:len(body)/3]
		}
		return body
	}}
	got, count, err := fetchAll(t, s, lr, src)
	if err != nil || !bytes.Equal(got, blob) || count != int64(len(blob)) {
		t.Fatalf("resumed fetch: %v (read %d, counted %d)", err, len(got), count)
	}
	resumed := 0
	for _, a := range src.asked {
		if a%1000 != 0 {
			resumed++
		}
	}
	if resumed != 10 {
		t.Fatalf("want every range resumed once from its last byte, asked for %v", src.asked)
	}

	s.content.remove(strings.TrimPrefix(lr.Digest, "sha256:"))
	src = &fakeRanges{blob: blob, set: RangeFetch{MinSize: 1000, ChunkSize: 1000, Parallel: 3, Retries: 2}, cut: func(start, _ int64, body []byte) []byte {
		if start >= 4000 && start < 5000 {
			return body[:min(len(body), 10)]
		}
		return body
	}}
	if _, _, err := fetchAll(t, s, lr, src); err == nil || !strings.Contains(err.Error(), "3 attempts failed") {
		t.Fatalf("a range that keeps breaking: %v", err)
	}
	if left := storeLeftovers(t, dir); len(left) != 0 {
		t.Fatalf("a failed fetch left %v", left)
	}
}

// TestRangeFetchNotFoundIsNotRetried: a range the registry refuses as
// not found (or unauthorized) fails the fetch at once, leaving nothing.
func TestRangeFetchNotFoundIsNotRetried(t *testing.T) {
	s, dir := newTestStore(t, Options{})
	blob, lr := randomBlob(3000)
	src := &fakeRanges{blob: blob, err: fmt.Errorf("blob gone: %w", errdefs.ErrNotFound), set: RangeFetch{MinSize: 1000, ChunkSize: 1000, Parallel: 1, Retries: 5}}
	if _, _, err := fetchAll(t, s, lr, src); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a range not found: %v", err)
	}
	if len(src.asked) != 2 {
		t.Fatalf("want the probe and one request, asked for %v", src.asked)
	}
	if left := storeLeftovers(t, dir); len(left) != 0 {
		t.Fatalf("a failed fetch left %v", left)
	}
}

// TestRangeFetchWholeAnswerIsOneStream: a source that answers the first
// range with the whole blob (200) is read as one stream.
func TestRangeFetchWholeAnswerIsOneStream(t *testing.T) {
	s, _ := newTestStore(t, Options{})
	blob, lr := randomBlob(5000)
	src := &fakeRanges{blob: blob, whole: true, set: RangeFetch{MinSize: 1000, ChunkSize: 1000, Parallel: 3}}
	got, _, err := fetchAll(t, s, lr, src)
	if err != nil || !bytes.Equal(got, blob) || len(src.asked) != 1 {
		t.Fatalf("one stream: %v, %d bytes, asked %v", err, len(got), src.asked)
	}
}

// rangeLog serves the busybox layer in ranges through serve and records
// the Range header of every request.
type rangeLog struct {
	mu     sync.Mutex
	ranges []string
}

func (l *rangeLog) add(r string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ranges = append(l.ranges, r)
	return len(l.ranges)
}

func (l *rangeLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ranges)
}

// pullChecked pulls the multi-layer image and checks its bottom layer.
func pullChecked(t *testing.T, s *Store, reg *testimages.Registry) {
	t.Helper()
	img, err := s.Pull(context.Background(), reg.Ref(testimages.MultiLayerRef), nil)
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	_, lower, err := s.Acquire(context.Background(), img.ID, "check")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(lower[len(lower)-1], "bin", "busybox")); err != nil || fi.Size() < 100_000 {
		t.Fatalf("bottom layer incomplete: %v", err)
	}
	if es, _ := os.ReadDir(filepath.Join(s.Dir(), "ingest")); len(es) != 0 {
		t.Fatalf("ingest holds %d entries after the pull", len(es))
	}
}

// TestPullRangesFromRegistry pulls through the test registry: in ranges
// (resuming a connection cut midway), and as one stream from a registry
// that ignores Range.
func TestPullRangesFromRegistry(t *testing.T) {
	requireRoot(t)
	t.Run("cut midway resumes", func(t *testing.T) {
		reg := testimages.StartRegistry(t)
		reg.PushStandard(t)
		layer := multiLayerDigests(t)[0]
		var log rangeLog
		reg.ServeBlobWith(t, layer, func(w http.ResponseWriter, req *http.Request, body []byte) {
			n := log.add(req.Header.Get("Range"))
			start, end, _ := testimages.RangeOf(w, req, len(body))
			if n == 2 {
				// Content-Length promises the range; the connection ends
				// a third of the way in.
				end = start + (end-start)/3
			}
			_, _ = w.Write(body[start:end])
		})
		s, _ := newTestStore(t, Options{RangeFetch: testRanges})
		pullChecked(t, s, reg)
		asked := log.list()
		if len(asked) < 5 || !slices.ContainsFunc(asked, func(r string) bool {
			var a, b int64
			_, err := fmt.Sscanf(r, "bytes=%d-%d", &a, &b)
			return err == nil && a%testRanges.ChunkSize != 0
		}) {
			t.Fatalf("want ranges and one resumed mid-chunk, registry saw %q", asked)
		}
	})
	t.Run("registry ignores Range", func(t *testing.T) {
		reg := testimages.StartRegistry(t)
		reg.PushStandard(t)
		layer := multiLayerDigests(t)[0]
		var log rangeLog
		reg.ServeBlobWith(t, layer, func(w http.ResponseWriter, req *http.Request, body []byte) {
			log.add(req.Header.Get("Range"))
			_, _ = w.Write(body)
		})
		s, _ := newTestStore(t, Options{RangeFetch: testRanges})
		pullChecked(t, s, reg)
		if asked := log.list(); len(asked) != 1 || asked[0] == "" {
			t.Fatalf("want one ranged probe answered with the whole blob, registry saw %q", asked)
		}
	})
	t.Run("corrupt range refused", func(t *testing.T) {
		reg := testimages.StartRegistry(t)
		reg.PushStandard(t)
		layer := multiLayerDigests(t)[0]
		reg.ServeBlobWith(t, layer, func(w http.ResponseWriter, req *http.Request, body []byte) {
			start, end, _ := testimages.RangeOf(w, req, len(body))
			part := slices.Clone(body[start:end])
			if start == 4*int(testRanges.ChunkSize) {
				part[100] ^= 0x40
			}
			_, _ = w.Write(part)
		})
		s, dir := newTestStore(t, Options{RangeFetch: testRanges})
		if _, err := s.Pull(context.Background(), reg.Ref(testimages.MultiLayerRef), nil); err == nil {
			t.Fatal("pull of a corrupt range succeeded")
		}
		waitEmpty(t, dir)
	})
}

// TestPullStalledRangeTimesOut stalls one range while the others arrive:
// the bytes of all ranges count as progress, and once none moves the pull
// fails with DeadlineExceeded and leaves nothing.
func TestPullStalledRangeTimesOut(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	layer := multiLayerDigests(t)[0]
	stalled := make(chan struct{})
	var once sync.Once
	reg.ServeBlobWith(t, layer, func(w http.ResponseWriter, req *http.Request, body []byte) {
		start, end, _ := testimages.RangeOf(w, req, len(body))
		if start == 2*int(testRanges.ChunkSize) {
			_, _ = w.Write(body[start : start+100])
			w.(http.Flusher).Flush()
			once.Do(func() { close(stalled) })
			<-req.Context().Done()
			return
		}
		_, _ = w.Write(body[start:end])
	})
	s, dir := newTestStore(t, Options{RangeFetch: testRanges, PullProgressTimeout: 500 * time.Millisecond})
	_, err := s.Pull(context.Background(), reg.Ref(testimages.MultiLayerRef), nil)
	select {
	case <-stalled:
	default:
		t.Fatal("the pull never asked for the stalled range")
	}
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "image_pull_progress_timeout") {
		t.Fatalf("stalled range: %v; want DeadlineExceeded naming image_pull_progress_timeout", err)
	}
	waitEmpty(t, dir)
}
