package image

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// storeLeftovers lists what a store holds in the dirs a failed pull must
// leave empty: ingest/ (downloads and unpacks in progress), layers/,
// blobs/ and records/.
func storeLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, sub := range []string{"ingest", "layers", "blobs/sha256", "records", "trash"} {
		es, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out = append(out, sub+"/"+e.Name())
		}
	}
	return out
}

// waitEmpty waits until a failed pull's abandoned layer streams have
// cleaned up (they end asynchronously after the pull returned).
func waitEmpty(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := storeLeftovers(t, dir)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a failed pull left: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func multiLayerDigests(t *testing.T) (layers []string) {
	t.Helper()
	img, err := testimages.MultiLayer()
	if err != nil {
		t.Fatal(err)
	}
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		d, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, d.String())
	}
	return layers
}

// TestPullStreamFailuresUndoTheLayer breaks one layer's stream in each way
// a registry or network can and checks that the pull fails, that the half
// unpacked layer and half downloaded blob are gone (nothing in ingest/, no
// layer, blob or record), and that a pull once the registry is healthy
// again stores the image whole.
func TestPullStreamFailuresUndoTheLayer(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name  string
		serve testimages.BlobServer
		want  error  // kind, when the failure has one
		msg   string // in the error
	}{
		{"digest mismatch", func(w http.ResponseWriter, _ *http.Request, body []byte) {
			// The gzip header's MTIME: a valid stream of the same content
			// and size whose digest differs. Only the digest check sees it.
			bad := slices.Clone(body)
			bad[4] ^= 0xff
			_, _ = w.Write(bad)
		}, errdefs.ErrInvalidArgument, "downloaded content has digest"},
		{"truncated stream", func(w http.ResponseWriter, _ *http.Request, body []byte) {
			// Content-Length says the whole blob; the connection ends at half.
			_, _ = w.Write(body[:len(body)/2])
		}, nil, "unexpected EOF"},
		{"corrupt data", func(w http.ResponseWriter, _ *http.Request, body []byte) {
			bad := slices.Clone(body)
			for i := len(bad) / 3; i < len(bad)/3+64; i++ {
				bad[i] ^= 0x5a
			}
			_, _ = w.Write(bad)
		}, nil, "layer sha256:"},
		{"longer than the manifest says", func(w http.ResponseWriter, _ *http.Request, body []byte) {
			w.Header().Del("Content-Length")
			_, _ = w.Write(append(slices.Clone(body), make([]byte, 4096)...))
		}, errdefs.ErrInvalidArgument, "the manifest says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := testimages.StartRegistry(t)
			reg.PushStandard(t)
			layers := multiLayerDigests(t)
			// The biggest layer (busybox itself) breaks; the others stream
			// beside it and are undone too, as nothing records them.
			reg.ServeBlobWith(t, layers[0], tc.serve)
			dir := filepath.Join(t.TempDir(), "images")
			s, err := Open(Options{Root: dir})
			if err != nil {
				t.Fatal(err)
			}
			ref := reg.Ref(testimages.MultiLayerRef)
			_, err = s.Pull(context.Background(), ref, nil)
			if err == nil {
				t.Fatal("pull of a broken layer succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v: want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q does not say %q", err, tc.msg)
			}
			waitEmpty(t, dir)
			if imgs := s.List(); len(imgs) != 0 {
				t.Fatalf("images after a failed pull: %v", imgs)
			}
			reg.ServeBlobWith(t, layers[0], nil)
			img, err := s.Pull(context.Background(), ref, nil)
			if err != nil {
				t.Fatalf("pull once the registry is healthy: %v", err)
			}
			_, lower, err := s.Acquire(context.Background(), img.ID, "check")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(lower[len(lower)-1], "bin", "busybox")); err != nil {
				t.Fatalf("bottom layer incomplete: %v", err)
			}
		})
	}
}

// TestPullStallTimesOut pulls from a registry that sends half a layer and
// then nothing: the pull fails with DeadlineExceeded after the progress
// timeout, though the caller set no deadline (as the kubelet does not),
// and leaves nothing behind.
func TestPullStallTimesOut(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	layers := multiLayerDigests(t)
	hold := reg.HoldBlob(t, layers[len(layers)-1])
	dir := filepath.Join(t.TempDir(), "images")
	s, err := Open(Options{Root: dir, PullProgressTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = s.Pull(context.Background(), reg.Ref(testimages.MultiLayerRef), nil)
	took := time.Since(start)
	select {
	case <-hold.Arrived:
	default:
		t.Fatal("the pull never reached the stalled blob")
	}
	if !errors.Is(err, errdefs.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "image_pull_progress_timeout") {
		t.Fatalf("stalled pull: %v; want DeadlineExceeded naming image_pull_progress_timeout", err)
	}
	// Generous: the point is that it ends at all, on a loaded machine.
	if took > 30*time.Second {
		t.Fatalf("stalled pull took %v to give up", took)
	}
	waitEmpty(t, dir)
	hold.Release()
	if _, err := s.Pull(context.Background(), reg.Ref(testimages.MultiLayerRef), nil); err != nil {
		t.Fatalf("pull after the stall: %v", err)
	}
}

// TestPullSlowButSteadyDoesNotTimeOut trickles a layer for several times
// the progress timeout: bytes keep coming, so the pull completes. The
// timeout is about silence, not about how long a pull takes.
func TestPullSlowButSteadyDoesNotTimeOut(t *testing.T) {
	requireRoot(t)
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	layers := multiLayerDigests(t)
	const timeout = 400 * time.Millisecond
	reg.ServeBlobWith(t, layers[0], func(w http.ResponseWriter, req *http.Request, body []byte) {
		chunk := len(body)/12 + 1
		for off := 0; off < len(body); off += chunk {
			_, _ = w.Write(body[off:min(off+chunk, len(body))])
			w.(http.Flusher).Flush()
			select {
			case <-time.After(timeout / 3):
			case <-req.Context().Done():
				return
			}
		}
	})
	s, err := Open(Options{Root: filepath.Join(t.TempDir(), "images"), PullProgressTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.Pull(context.Background(), reg.Ref(testimages.MultiLayerRef), nil); err != nil {
		t.Fatalf("steady pull: %v", err)
	}
	if took := time.Since(start); took < 2*timeout {
		t.Fatalf("the trickle took only %v: the test proves nothing", took)
	}
}
