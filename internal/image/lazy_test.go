package image

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/fuseconn"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
	"github.com/berthcri/berth/internal/testutil/mounttest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Lazy layers handed to a holder (decision 3600, S4): these tests play
// the node's keeper with a lazysrv.Server in the test process (the
// server berth-lazy runs), so that berthd's side is tested whole: the
// mount, the files of the layer dir, the range socket, complete.json,
// the corrupt mark, the drop, and the take-up at start. Files of the
// mounts are read by `cat`, never opened by this process, which serves
// them (fuseconn's contract).

// serverHolder is a LazyHolder that serves the layers it is handed in
// this process; fail, if set, refuses every hold.
type serverHolder struct {
	srv  *lazysrv.Server
	mu   sync.Mutex
	held map[string]bool
	fail error
}

func newServerHolder(t *testing.T) *serverHolder {
	opts := lazysrv.DefaultOptions(slog.New(slog.DiscardHandler))
	opts.Retries, opts.RetryDelay, opts.RequestTimeout, opts.CompletePoll = 2, 50*time.Millisecond, 10*time.Second, 50*time.Millisecond
	h := &serverHolder{srv: lazysrv.New(opts), held: map[string]bool{}}
	t.Cleanup(func() {
		for _, id := range h.list() {
			h.srv.Drop(id)
		}
	})
	return h
}

func (h *serverHolder) Hold(ctx context.Context, chainID, dir string, conn *os.File) error {
	if h.fail != nil {
		return h.fail
	}
	if err := h.srv.Add(ctx, chainID, dir, conn); err != nil {
		return err
	}
	h.mu.Lock()
	h.held[chainID] = true
	h.mu.Unlock()
	return nil
}

func (h *serverHolder) Drop(_ context.Context, chainID string) error {
	h.srv.Drop(chainID)
	h.mu.Lock()
	delete(h.held, chainID)
	h.mu.Unlock()
	return nil
}

func (h *serverHolder) Held(context.Context) ([]string, error) { return h.list(), nil }

func (h *serverHolder) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for id := range h.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// lazyRig is an all-eStargz image on a registry that serves ranges and
// holds whole-blob GETs (the background fetch) until release.
type lazyRig struct {
	reg     *testimages.Registry
	ref     string
	dir     string // the store's root
	hold    chan struct{}
	once    sync.Once
	digests []string
	ranged  atomic.Int64 // range requests answered
}

func (r *lazyRig) release() { r.once.Do(func() { close(r.hold) }) }

func newLazyRig(t *testing.T) *lazyRig {
	t.Helper()
	requireRoot(t)
	base, err := testimages.Build([][]testimages.File{{
		{Name: "data", Dir: true},
		{Name: "data/hello", Data: []byte("hello\n")},
		{Name: "data/later", Data: []byte("read on demand\n")},
	}}, v1.Config{})
	img := testimages.EStargz(t, testimages.Must(t, base, err), "data/hello")
	r := &lazyRig{reg: testimages.StartRegistry(t), dir: filepath.Join(t.TempDir(), "images"), hold: make(chan struct{})}
	t.Cleanup(r.release)
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range mf.Layers {
		r.digests = append(r.digests, l.Digest.String())
		r.reg.ServeBlobWith(t, l.Digest.String(), func(w http.ResponseWriter, req *http.Request, body []byte) {
			if req.Header.Get("Range") == "" {
				select {
				case <-r.hold:
				case <-req.Context().Done():
					return
				}
			}
			start, end, ranged := testimages.RangeOf(w, req, len(body))
			if ranged {
				r.ranged.Add(1)
			}
			_, _ = w.Write(body[start:end])
		})
	}
	r.reg.Push(t, "lazy/img:1", img)
	r.ref = r.reg.Ref("lazy/img:1")
	t.Cleanup(func() {
		// Whatever a failed test left mounted.
		for _, m := range mounttest.FUSEBelow(t, r.dir) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	return r
}

func (r *lazyRig) open(t *testing.T, h LazyHolder) *Store {
	t.Helper()
	s, err := Open(Options{Root: r.dir, LazyPull: true, LazyHolder: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// catFile reads path in a process of its own.
func catFile(t *testing.T, path string) (string, error) {
	t.Helper()
	out, err := exec.Command("cat", path).CombinedOutput()
	return string(out), err
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in 30 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// layerDirsWith are the layer dirs of s that have file.
func layerDirsWith(t *testing.T, s *Store, file string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(s.Dir(), "layers", "*", file))
	if err != nil {
		t.Fatal(err)
	}
	for i := range m {
		m[i] = filepath.Dir(m[i])
	}
	return m
}

// TestLazyLayerHandedToHolder: a lazy pull mounts each eStargz layer,
// writes what a server needs into its dir and hands the connection to the
// holder, whose server reads a chunk not on disk through berthd's range
// socket; ImageStatus counts the chunks on disk; once the background
// fetch has the blob, complete.json makes the server write the files out;
// removing the image detaches the layers and drops them from the holder.
func TestLazyLayerHandedToHolder(t *testing.T) {
	r := newLazyRig(t)
	h := newServerHolder(t)
	s := r.open(t, h)
	ctx := context.Background()
	img, err := s.Pull(ctx, r.ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.list(); len(got) != 2 || !slices.Equal(got, sortedCopy(img.ChainIDs)) {
		t.Fatalf("held %v, want the image's layers %v", got, img.ChainIDs)
	}
	dirs := layerDirsWith(t, s, lazysrv.MetaFile)
	if len(dirs) != 2 || len(mounttest.FUSEBelow(t, r.dir)) != 2 {
		t.Fatalf("lazy layer dirs %v, mounts %v", dirs, mounttest.FUSEBelow(t, r.dir))
	}
	for _, d := range dirs {
		for _, f := range []string{lazysrv.SettingsFile, lazysrv.TOCFile} {
			if _, err := os.Stat(filepath.Join(d, f)); err != nil {
				t.Fatalf("layer dir: %v", err)
			}
		}
		meta, err := lazysrv.LoadMeta(d)
		if err != nil || meta.Socket != filepath.Join(r.dir, "lazy.sock") {
			t.Fatalf("lazy.json: %+v, %v", meta, err)
		}
	}
	if st, err := os.Stat(filepath.Join(r.dir, "lazy.sock")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("range socket: %v, %v", st, err)
	}
	for _, dg := range r.digests {
		if s.content.has(dg) {
			t.Fatalf("blob %s stored before the background fetch", dg)
		}
	}
	top := s.LayerDiffDir(img.ChainIDs[1])
	before := r.ranged.Load()
	if got, err := catFile(t, filepath.Join(top, "data", "later")); err != nil || got != "read on demand\n" {
		t.Fatalf("a chunk asked of berthd: %q, %v", got, err)
	}
	if r.ranged.Load() == before {
		t.Fatal("reading a chunk not on disk made no range request")
	}
	// ImageStatus: the config and the chunks on disk.
	got, err := s.Get(r.ref)
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(len(mustConfig(t, s, img.ID)))
	for _, d := range dirs {
		n, _ := s.lazy.onDisk("sha256:" + filepath.Base(d))
		want += uint64(n)
	}
	if got.Size != want || want <= uint64(len(mustConfig(t, s, img.ID))) {
		t.Fatalf("image size %d, want %d (config and cached chunks)", got.Size, want)
	}

	r.release()
	waitFor(t, "the layers complete and their files written", func() bool {
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, lazysrv.CacheDir, "files")); err != nil {
				return false
			}
			if _, err := os.Stat(filepath.Join(d, lazysrv.CompleteFile)); err != nil {
				return false
			}
		}
		return true
	})
	if got, err := catFile(t, filepath.Join(top, "data", "hello")); err != nil || got != "hello\n" {
		t.Fatalf("a file of the complete layer: %q, %v", got, err)
	}
	if err := s.Remove(r.ref); err != nil {
		t.Fatal(err)
	}
	if m := mounttest.FUSEBelow(t, r.dir); len(m) != 0 || len(h.list()) != 0 || len(layerDirsWith(t, s, lazysrv.MetaFile)) != 0 {
		t.Fatalf("after removal: mounts %v, held %v", m, h.list())
	}
}

// TestLazyLayerPulledWholeWithoutAHolder: with no holder, or one that
// refuses the layer, an eStargz layer is pulled whole and nothing of the
// lazy path is left.
func TestLazyLayerPulledWholeWithoutAHolder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		holder func(t *testing.T) LazyHolder
	}{
		{"none", func(*testing.T) LazyHolder { return nil }},
		{"refuses", func(t *testing.T) LazyHolder {
			h := newServerHolder(t)
			h.fail = errors.New("no keeper here")
			return h
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLazyRig(t)
			r.release()
			s := r.open(t, tc.holder(t))
			img, err := s.Pull(context.Background(), r.ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			if m := mounttest.FUSEBelow(t, r.dir); len(m) != 0 {
				t.Fatalf("lazy mounts: %v", m)
			}
			for _, dg := range r.digests {
				if !s.content.has(dg) {
					t.Fatalf("blob %s not downloaded", dg)
				}
			}
			if _, err := os.Stat(filepath.Join(s.LayerDiffDir(img.ChainIDs[1]), "data", "later")); err != nil {
				t.Fatalf("layer not unpacked: %v", err)
			}
			if d := layerDirsWith(t, s, lazysrv.MetaFile); len(d) != 0 {
				t.Fatalf("lazy layer dirs left: %v", d)
			}
		})
	}
}

// TestLazyLayerCorruptMarkRemovesTheImage: the server's corrupt mark in a
// layer dir (a chunk that failed its digest) is counted once and removes
// the image; the collector then drops the layers.
func TestLazyLayerCorruptMarkRemovesTheImage(t *testing.T) {
	r := newLazyRig(t)
	h := newServerHolder(t)
	s := r.open(t, h)
	img, err := s.Pull(context.Background(), r.ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := s.layers.layerDir(img.ChainIDs[1])
	if err := os.WriteFile(filepath.Join(dir, lazysrv.CorruptFile), []byte("chunk sha256:x does not match\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the image removed", func() bool {
		_, err := s.Get(r.ref)
		return err != nil
	})
	s.WaitGC()
	if n := s.LazyCorruptChunks(); n != 1 {
		t.Fatalf("corrupt layers counted: %d, want 1", n)
	}
	if m := mounttest.FUSEBelow(t, r.dir); len(m) != 0 || len(h.list()) != 0 {
		t.Fatalf("after the corrupt mark: mounts %v, held %v", m, h.list())
	}
}

// TestLazyLayerTakenUpAtStart: a store closed (berthd ending) leaves its
// lazy layers mounted and held; the next one takes them up, rebuilds the
// registry access from the image's reference (no pull's credentials),
// answers the server's range requests again and completes the background
// fetch. A store that starts while the holder holds nothing drops the
// layers and the image.
func TestLazyLayerTakenUpAtStart(t *testing.T) {
	r := newLazyRig(t)
	h := newServerHolder(t)
	s := r.open(t, h)
	img, err := s.Pull(context.Background(), r.ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if m := mounttest.FUSEBelow(t, r.dir); len(m) != 2 {
		t.Fatalf("mounts after Close: %v, want both layers kept", m)
	}
	top := s.LayerDiffDir(img.ChainIDs[1])
	if _, err := catFile(t, filepath.Join(top, "data", "later")); err == nil {
		t.Fatal("a chunk not on disk read with no berthd to ask")
	}
	s = r.open(t, h)
	if _, err := s.Get(r.ref); err != nil {
		t.Fatalf("image after the restart: %v", err)
	}
	waitFor(t, "the range socket answering for the layer", func() bool {
		got, err := catFile(t, filepath.Join(top, "data", "later"))
		return err == nil && got == "read on demand\n"
	})
	r.release()
	waitFor(t, "the background fetch resumed and complete", func() bool {
		_, err := os.Stat(filepath.Join(s.layers.layerDir(img.ChainIDs[1]), lazysrv.CompleteFile))
		return err == nil
	})
	s.Close()

	// The keeper gone (it holds nothing): the layers cannot be kept.
	for _, id := range h.list() {
		h.srv.Drop(id)
	}
	h.mu.Lock()
	h.held = map[string]bool{}
	h.mu.Unlock()
	s = r.open(t, h)
	if _, err := s.Get(r.ref); err == nil {
		t.Fatal("image with unheld lazy layers kept")
	}
	if m := mounttest.FUSEBelow(t, r.dir); len(m) != 0 || len(layerDirsWith(t, s, lazysrv.MetaFile)) != 0 {
		t.Fatalf("after a start with nothing held: mounts %v", m)
	}
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

func mustConfig(t *testing.T, s *Store, id string) []byte {
	t.Helper()
	b, err := s.ConfigJSON(id)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMountAnswersDoesNotHangOnAServerThatDoesNot: berthd's look at a
// lazy layer's mount at start, on a mount whose connection nobody serves
// (a hung server), returns that it does not answer instead of holding
// berthd's start; a mount that is not FUSE is not mounted.
func TestMountAnswersDoesNotHangOnAServerThatDoesNot(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if why := mountAnswers(dir, time.Minute); why != "not mounted" {
		t.Fatalf("a plain dir: %q", why)
	}
	dev, _, err := fuseconn.Mount(dir, &lazy.HeldOptions().MountOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Closing the last fd aborts the connection: the look's goroutine
		// gets its error.
		dev.Close()
		_ = fuseconn.Unmount(dir)
	})
	if why := mountAnswers(dir, 200*time.Millisecond); !strings.Contains(why, "did not answer") {
		t.Fatalf("a mount nobody serves: %q", why)
	}
}
