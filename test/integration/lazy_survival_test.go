package integration

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/mounttest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Lazy layers outlive berthd and their server (decision 3600, S4): the
// node's keeper holds each layer's FUSE connection and runs berth-lazy,
// which serves it; berthd answers its range requests and fetches the
// blob in the background.

// lazyNodeDir is the node's keeper and monitor dir of d.
func lazyNodeDir(d *berthdtest.Daemon) string { return filepath.Join(d.State, "shims", ".node") }

// lazyServerLog is the log of d's node's lazy-layer server ("" before it
// started).
func lazyServerLog(t *testing.T, d *berthdtest.Daemon) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(lazyNodeDir(d), "lazy.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(data)
}

// lazyServerPids are the berth-lazy processes of d's node (its log is in
// d's node dir).
func lazyServerPids(t *testing.T, d *berthdtest.Daemon) []int {
	t.Helper()
	es, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	want := "\x00" + filepath.Join(lazyNodeDir(d), "lazy.log")
	for _, e := range es {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.TrimSpace(string(comm)) == "berth-lazy" && strings.Contains(string(cmd), want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readLoop is a container script that reads path every 100 ms for ever
// and prints READFAIL each time a read fails.
func readLoop(path string) string {
	return "while :; do cat " + path + " >/dev/null || echo READFAIL; sleep 0.1; done"
}

// TestLazyPullBerthdKilledKeepsItsLazyLayers: berthd killed with -9
// while a container reads a lazy layer and the layer's background fetch
// is under way. The container reads on (the layer is served by the
// keeper's berth-lazy, not by berthd); the berthd that starts takes the
// layers up (the image stays listed and mounted), answers the server's
// range requests again from the image's reference (a file never read
// before reads), and the background fetch resumes and completes; removing
// everything leaves nothing.
func TestLazyPullBerthdKilledKeepsItsLazyLayers(t *testing.T) {
	t.Parallel()
	p := pullLazy(t, "lazy/killed", true, berthdtest.Options{})
	reg, log, d, scope, before, ref := p.reg, p.log, p.d, p.scope, p.before, p.ref
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 2 {
		t.Fatalf("lazy mounts: %q", m)
	}
	e := lazyCtrEnv(t, d, reg, "lazy-killed")
	cfg := e.config("reader", "sh", "-c", readLoop("/data/hello"))
	cfg.Image.Image = ref
	id := e.run(cfg)

	d.Restart()
	if st := imageStatus(t, d, ref); st == nil {
		t.Fatal("image with lazy layers not listed after berthd's restart")
	}
	if m := mounttest.FUSEBelow(t, d.Root); len(m) != 2 {
		t.Fatalf("lazy mounts after the restart: %q", m)
	}
	// Never read before: its chunk comes through the new berthd.
	if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
		t.Fatalf("after the restart: %q", got)
	}
	requireNoBlob(t, d, p.dataDigest)
	log.release()
	lazyWait(t, func() bool { return blobStored(d, p.dataDigest) })
	if out, _ := os.ReadFile(e.status(id).LogPath); strings.Contains(string(out), "READFAIL") {
		t.Fatalf("the container's reads failed across berthd's restart:\n%s", out)
	}
	stopRemove(t, d, e.pod)
	removeSettled(t, d, ref, scope, before)
}

// servedLog counts the bytes the registry served of one blob, by GET,
// before and after a point (berthd's restart).
type servedLog struct {
	mu    sync.Mutex
	after bool
	gets  [2][]servedGet // [0] before, [1] after
}

type servedGet struct {
	rng   string // the Range header ("" for a whole GET)
	bytes int
}

func (l *servedLog) add(rng string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := 0
	if l.after {
		i = 1
	}
	l.gets[i] = append(l.gets[i], servedGet{rng, n})
}

func (l *servedLog) restarting() {
	l.mu.Lock()
	l.after = true
	l.mu.Unlock()
}

func (l *servedLog) isAfter() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.after
}

func (l *servedLog) since() []servedGet {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.gets[1])
}

// partialBlobSize is the size of the file that holds the blob digest's
// bytes fetched so far in d's store (a lazy layer's partial blob, or an
// ingest file), -1 when there is none.
func partialBlobSize(t *testing.T, d *berthdtest.Daemon, digest string) int64 {
	t.Helper()
	b, _ := filepath.Glob(filepath.Join(d.Root, "images", "ingest", "blob-"+strings.TrimPrefix(digest, "sha256:")+"-*"))
	for _, p := range append([]string{partialBlobOf(t, d, digest)}, b...) {
		if st, err := os.Stat(p); err == nil {
			return st.Size()
		}
	}
	return -1
}

// partialBlobOf is the path of the partial blob of the lazy layer whose
// blob is digest in d's store (which may not exist).
func partialBlobOf(t *testing.T, d *berthdtest.Daemon, digest string) string {
	t.Helper()
	metas, _ := filepath.Glob(filepath.Join(d.Root, "images", "layers", "*", "lazy.json"))
	for _, m := range metas {
		if data, err := os.ReadFile(m); err == nil && strings.Contains(string(data), digest) {
			return filepath.Join(filepath.Dir(m), image.PartialBlobFile)
		}
	}
	t.Fatalf("no lazy layer of blob %s", digest)
	return ""
}

// TestLazyPullFetchResumesAfterBerthdKill: berthd killed with -9 while
// the background fetch of a lazy layer has half its blob (the registry
// sent half and holds the rest). The berthd that starts takes the layer
// up and its background fetch continues from the bytes on disk: the
// registry serves only the rest (one range from where the file ends, no
// whole GET), and the layer completes and verifies (digest of the whole
// blob, its diff ID), its files read from disk; removing everything
// leaves nothing. A partial blob changed while berthd was away fails
// the verification of the resumed fetch: it is discarded and the blob
// fetched again from its start (the layer is not called corrupt for
// it).
func TestLazyPullFetchResumesAfterBerthdKill(t *testing.T) {
	t.Parallel()
	// The ranged case: chunks of 64 KiB, one at a time; the registry
	// holds the fifth (from 256 KiB), and the recorded prefix says 256 KiB.
	const chunk, heldChunk = 64 << 10, 4
	for _, tc := range []struct {
		name   string
		tamper bool
		ranged bool
	}{
		{name: "resumes"},
		{name: "tampered", tamper: true},
		{name: "ranged", ranged: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := testimages.StartRegistry(t)
			img := lazyImage(t)
			blob, dataDigest, _ := layerOf(t, img, 1)
			// resumeAt: what the first berthd has on disk when it dies.
			resumeAt := len(blob) / 2
			held := ""
			opts := berthdtest.Options{}
			if tc.ranged {
				resumeAt = heldChunk * chunk
				held = fmt.Sprintf("bytes=%d-%d", resumeAt, resumeAt+chunk-1)
				opts.Configure = func(c *config.Config) {
					c.ImageRangeFetch = config.ImageRangeFetch{Enable: true, MinLayerSize: chunk, ChunkSize: chunk, Parallel: 1, Retries: 1}
				}
			}
			var served servedLog
			reg.ServeBlobWith(t, dataDigest, func(w http.ResponseWriter, req *http.Request, body []byte) {
				rng := req.Header.Get("Range")
				switch {
				case served.isAfter():
				case !tc.ranged && rng == "":
					// The background fetch of the first berthd: half
					// the blob, then nothing until that berthd is gone.
					n, _ := w.Write(body[:resumeAt])
					served.add(rng, n)
					w.(http.Flusher).Flush()
					<-req.Context().Done()
					return
				case tc.ranged && rng == held:
					served.add(rng, 0)
					<-req.Context().Done()
					return
				}
				start, end, _ := testimages.RangeOf(w, req, len(body))
				n, _ := w.Write(body[start:end])
				served.add(rng, n)
			})
			reg.Push(t, "lazy/resume:1", img)
			d, scope, before := lazyDaemon(t, opts)
			ref := reg.Ref("lazy/resume:1")
			pull(t, d, ref, nil)
			if tc.ranged {
				lazyWait(t, func() bool { return partialBlobPrefix(t, d, dataDigest) == int64(resumeAt) })
			} else {
				lazyWait(t, func() bool { return partialBlobSize(t, d, dataDigest) == int64(resumeAt) })
			}

			served.restarting()
			d.Kill()
			if tc.tamper {
				tamperPartialBlob(t, partialBlobOf(t, d, dataDigest))
			}
			d.Start()
			d.WaitReady()
			lazyWait(t, func() bool { return blobStored(d, dataDigest) })
			gets := served.since()
			want := fmt.Sprintf("bytes=%d-%d", resumeAt, len(blob)-1)
			if tc.ranged {
				want = held
			}
			total := 0
			for _, g := range gets {
				total += g.bytes
			}
			switch {
			case tc.ranged && (len(gets) == 0 || gets[0].rng != want || total != len(blob)-resumeAt):
				t.Fatalf("after the restart the registry served %+v (%d bytes), want ranges from %q, %d bytes in all", gets, total, want, len(blob)-resumeAt)
			case !tc.ranged && !tc.tamper && (len(gets) != 1 || gets[0].rng != want || total != len(blob)-resumeAt):
				t.Fatalf("after the restart the registry served %+v (%d bytes), want one GET %q of the %d bytes left", gets, total, want, len(blob)-resumeAt)
			case tc.tamper && (len(gets) != 2 || gets[0].rng != want || gets[1] != servedGet{"", len(blob)}):
				t.Fatalf("after the restart the registry served %+v, want the GET %q, then the whole blob again", gets, want)
			}
			if n := partialBlobSize(t, d, dataDigest); n != -1 {
				t.Fatalf("partial blob of %d bytes left after the commit", n)
			}
			if st := imageStatus(t, d, ref); st == nil || st.Size < uint64(len(blob)) {
				t.Fatalf("ImageStatus size %v after the fetch completed, want at least the %d bytes of the data layer", st.GetSize(), len(blob))
			}
			if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
				t.Fatalf("read from the completed layer: %q", got)
			}
			removeSettled(t, d, ref, scope, before)
		})
	}
}

// partialBlobPrefix is the prefix recorded beside the partial blob of
// the lazy layer of blob digest (a ranged fetch's), -1 when there is
// none.
func partialBlobPrefix(t *testing.T, d *berthdtest.Daemon, digest string) int64 {
	t.Helper()
	data, err := os.ReadFile(partialBlobOf(t, d, digest) + ".prefix")
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// tamperPartialBlob changes a byte in the middle of the partial blob at
// path.
func tamperPartialBlob(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// stallRanges makes the range GETs of digest wait while stalled is open;
// arrived counts those that came.
type stallRanges struct {
	mu      sync.Mutex
	stalled chan struct{}
	arrived int
}

func (s *stallRanges) stall() {
	s.mu.Lock()
	s.stalled = make(chan struct{})
	s.mu.Unlock()
}

func (s *stallRanges) release() {
	s.mu.Lock()
	if s.stalled != nil {
		close(s.stalled)
		s.stalled = nil
	}
	s.mu.Unlock()
}

func (s *stallRanges) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrived
}

// TestLazyPullServerKilledReadersRecover: berth-lazy killed with -9
// while a container's read of a lazy layer waits for its chunk (the
// registry stalls the range), and while another container reads the
// layer in a loop. The keeper starts the server again on the held
// connections: the blocked read is answered with the right bytes (the
// kernel resends it to the new server), the looping reader never fails,
// and removing everything leaves nothing.
func TestLazyPullServerKilledReadersRecover(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := lazyImage(t)
	_, baseDigest, _ := layerOf(t, img, 0)
	_, dataDigest, _ := layerOf(t, img, 1)
	var ranges stallRanges
	t.Cleanup(ranges.release)
	for _, dg := range []string{baseDigest, dataDigest} {
		reg.ServeBlobWith(t, dg, func(w http.ResponseWriter, req *http.Request, body []byte) {
			if req.Header.Get("Range") == "" {
				// No background fetch: the layers stay lazy (a complete
				// layer's files are read through FUSE passthrough, which
				// does not survive the server yet: decision 3600).
				http.Error(w, "not now", http.StatusNotFound)
				return
			}
			var stalled chan struct{}
			if dg == dataDigest {
				ranges.mu.Lock()
				ranges.arrived++
				stalled = ranges.stalled
				ranges.mu.Unlock()
			}
			if stalled != nil {
				select {
				case <-stalled:
				case <-req.Context().Done():
					return
				}
			}
			start, end, _ := testimages.RangeOf(w, req, len(body))
			_, _ = w.Write(body[start:end])
		})
	}
	reg.Push(t, "lazy/srvkill:1", img)
	d, scope, before := lazyDaemon(t, berthdtest.Options{})
	ref := reg.Ref("lazy/srvkill:1")
	pull(t, d, ref, nil)
	first := lazyServerPids(t, d)
	if len(first) != 1 {
		t.Fatalf("lazy-layer servers of the node: %v, want one", first)
	}

	e := lazyCtrEnv(t, d, reg, "lazy-srvkill")
	loop := e.config("looper", "sh", "-c", readLoop("/data/hello"))
	loop.Image.Image = ref
	looper := e.run(loop)
	ranges.stall()
	asked := ranges.count()
	blocked := e.config("blocked", "cat", "/data/later")
	blocked.Image.Image = ref
	reader := e.run(blocked)
	lazyWait(t, func() bool { return ranges.count() > asked })

	if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lazyWait(t, func() bool {
		pids := lazyServerPids(t, d)
		return len(pids) == 1 && !slices.Contains(pids, first[0])
	})
	ranges.release()
	st := e.waitExited(reader)
	if out := logText(t, st.LogPath); st.ExitCode != 0 || !strings.Contains(out, "stdout: "+lazyLater) {
		t.Fatalf("the read blocked at the kill: exit %d, output:\n%s", st.ExitCode, out)
	}
	if out, _ := os.ReadFile(e.status(looper).LogPath); strings.Contains(string(out), "READFAIL") {
		t.Fatalf("the looping reader failed across the server's death:\n%s", out)
	}
	stopRemove(t, d, e.pod)
	removeSettled(t, d, ref, scope, before)
}

// TestLazyPullServerKilledWithACompleteLayer: berth-lazy killed with -9
// once both lazy layers are complete (their files written out) while a
// container's shell (busybox, mapped) runs from them and holds a large
// file open. The kernel keeps each inode's I/O mode and backing file
// across the server's death (decision 3600, "Passthrough across
// servers"):
//   - opened after completion: the inodes are open in passthrough with
//     the dead server's backing files, and the new server must answer
//     their opens with the same backing IDs (another is refused, EIO);
//   - opened before completion: the inodes are open in cached mode, and
//     the new server must answer their opens in cached mode (a
//     passthrough open is refused, EIO).
//
// Either way every new exec of busybox in the container succeeds, the
// file opened before the kill reads whole through its old open, a new
// open of it reads the same, also after a second death, and removing
// everything leaves nothing.
func TestLazyPullServerKilledWithACompleteLayer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// openedBeforeComplete: the container starts while the layers'
		// background fetches are held.
		openedBeforeComplete bool
	}{
		{name: "OpenAfter"},
		{name: "OpenBefore", openedBeforeComplete: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := testimages.StartRegistry(t)
			img := lazyImage(t)
			log := &rangeLog{}
			log.holdWhole(t)
			for i := range 2 {
				_, dg, _ := layerOf(t, img, i)
				log.watch(t, reg, dg, nil)
			}
			reg.Push(t, "lazy/ptkill:1", img)
			d, scope, before := lazyDaemon(t, berthdtest.Options{})
			ref := reg.Ref("lazy/ptkill:1")
			pull(t, d, ref, nil)
			complete := func() {
				log.release()
				lazyWait(t, func() bool { return strings.Count(lazyServerLog(t, d), "lazy layer files local") == 2 })
			}
			if !tc.openedBeforeComplete {
				complete()
			}
			filler := fileInLayer(t, img, 1, "data/filler")
			sum := sha256.Sum256(filler)
			want := hex.EncodeToString(sum[:])

			e := lazyCtrEnv(t, d, reg, "lazy-ptkill")
			holder := e.config("holder", "sh", "-c",
				"exec 3</data/filler; echo ready; while [ ! -e /tmp/go ]; do sleep 0.1; done; sha256sum <&3; exec sleep 100000")
			holder.Image.Image = ref
			id := e.run(holder)
			lazyWait(t, func() bool { return strings.Contains(logText(t, e.status(id).LogPath), "stdout: ready") })
			if tc.openedBeforeComplete {
				complete()
			}

			killLazyServer(t, d)
			// Each exec opens busybox anew: the inode the shell holds open
			// since before the kill.
			for range 5 {
				if got := e.exec(id, "cat", "/data/hello"); got != lazyHello {
					t.Fatalf("cat /data/hello after the server's death: %q", got)
				}
				if got := e.exec(id, "sha256sum", "/data/filler"); got != want+"  /data/filler" {
					t.Fatalf("a new open of data/filler after the server's death: %q, want %s", got, want)
				}
			}
			e.exec(id, "touch", "/tmp/go")
			lazyWait(t, func() bool { return strings.Contains(logText(t, e.status(id).LogPath), "stdout: "+want+"  -") })
			// A second death with the inodes still held: the records of the
			// first server serve the third as well.
			killLazyServer(t, d)
			if got := e.exec(id, "sha256sum", "/data/filler"); got != want+"  /data/filler" {
				t.Fatalf("a new open of data/filler after the second death: %q", got)
			}
			if got := catInPod(t, d, reg, ref, "/data/later"); got != lazyLater {
				t.Fatalf("a new container after the server's deaths: %q", got)
			}
			// Where the kernel passes files through, the opens after
			// completion were passthrough opens (the layers' records name
			// backing IDs): the case this test is about.
			passthrough := !strings.Contains(lazyServerLog(t, d), "read through the FUSE server (not passed through")
			ids := backingIDsRecorded(t, d)
			t.Logf("FUSE passthrough: %v, backing IDs recorded: %d", passthrough, ids)
			if !tc.openedBeforeComplete && passthrough && ids == 0 {
				t.Fatal("passthrough, but no backing ID recorded")
			}
			stopRemove(t, d, e.pod)
			removeSettled(t, d, ref, scope, before)
		})
	}
}

// killLazyServer kills d's node's lazy-layer server (-9) and waits for
// the keeper to start the next.
func killLazyServer(t *testing.T, d *berthdtest.Daemon) {
	t.Helper()
	pids := lazyServerPids(t, d)
	if len(pids) != 1 {
		t.Fatalf("lazy-layer servers of the node: %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lazyWait(t, func() bool {
		now := lazyServerPids(t, d)
		return len(now) == 1 && now[0] != pids[0]
	})
}

// backingIDsRecorded counts the backing IDs in the records of d's lazy
// layers (the layer dir's "backing": a 32-byte header, then 16-byte
// records whose bytes 8-11 are the backing ID, 0 for a cached open).
func backingIDsRecorded(t *testing.T, d *berthdtest.Daemon) int {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(d.Root, "images", "layers", "*", "backing"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i := 32; i+16 <= len(data); i += 16 {
			if binary.LittleEndian.Uint32(data[i+8:]) != 0 {
				n++
			}
		}
	}
	return n
}
