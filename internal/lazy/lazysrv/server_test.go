package lazysrv_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/fuseconn"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
	"github.com/berthcri/berth/internal/shim/proto"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// roleEnv makes the test binary a lazy-layer server on fd 3, as the
// keeper starts berth-lazy.
const roleEnv = "LAZYSRV_TEST_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "reader" {
		os.Exit(runReader())
	}
	if os.Getenv(roleEnv) == "holder" {
		os.Exit(runHolder())
	}
	if os.Getenv(roleEnv) == "server" {
		opts := lazysrv.DefaultOptions(slog.New(slog.NewTextHandler(os.Stderr, nil)))
		// A missing chunk waits 0.1+0.2+0.4 s for berthd, then EIO.
		opts.Retries, opts.RetryDelay = 3, 100*time.Millisecond
		opts.CompletePoll = 50 * time.Millisecond
		if err := lazysrv.New(opts).Run(context.Background(), 3); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runReader reads argv[1] from offset argv[2], argv[3] bytes, to
// stdout: a container's read in a process of its own. (A reader in the
// test process would deadlock it: the fork of the next server inherits
// the open file, whose close at exec sends a FLUSH that only that server
// can answer.)
func runReader() int {
	var off int64
	var n int
	if _, err := fmt.Sscan(os.Args[2], &off); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if _, err := fmt.Sscan(os.Args[3], &n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fd, err := unix.Open(os.Args[1], unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// No readahead: the chunks asked of berthd are those read.
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	buf := make([]byte, n)
	got, err := unix.Pread(fd, buf, off)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Stdout.Write(buf[:got])
	return 0
}

// runHolder opens argv[1], says "open" on stdout, and at each line on
// stdin reads the whole file through that one open to stdout, ending with
// a line "end"; at stdin's end it exits. A container's process that holds
// a file open across its server's death.
func runHolder() int {
	fd, err := unix.Open(os.Args[1], unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("open")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		buf := make([]byte, st.Size)
		for off := 0; off < len(buf); {
			n, err := unix.Pread(fd, buf[off:], int64(off))
			if err != nil || n == 0 {
				fmt.Fprintln(os.Stderr, "read:", n, err)
				return 1
			}
			off += n
		}
		fmt.Printf("%x\nend\n", sha256.Sum256(buf))
	}
	return 0
}

// weights is 1 MiB that does not compress, in 64 KiB chunks: most of the
// layer's blob.
var weights = func() []byte {
	b := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{3}).Read(b)
	return b
}()

const chunk = 64 << 10

// testLayer is an eStargz layer's blob and its TOC digest.
func testLayer(t *testing.T) ([]byte, string) {
	t.Helper()
	return testimages.EStargzLayer(t, []testimages.File{
		{Name: "etc", Dir: true},
		{Name: "etc/conf", Data: []byte("conf=1\n")},
		{Name: "data", Dir: true},
		{Name: "data/weights", Data: weights},
	}, chunk)
}

// berthd stands in for berthd's side: the range socket, answering from
// the blob in memory, and counting; the request after stallNext is set
// waits for release.
type berthd struct {
	blob      []byte
	sock      string
	requests  atomic.Int64
	mu        sync.Mutex
	ln        net.Listener
	stallNext bool
	stalled   chan struct{}
	release   chan struct{}
}

func (b *berthd) Size() int64 { return int64(len(b.blob)) }

func (b *berthd) OpenRange(ctx context.Context, start, end int64) (io.ReadCloser, error) {
	b.requests.Add(1)
	b.mu.Lock()
	stall := b.stallNext
	b.stallNext = false
	b.mu.Unlock()
	if stall {
		select {
		case b.stalled <- struct{}{}:
		default:
		}
		select {
		case <-b.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return io.NopCloser(bytes.NewReader(b.blob[start:end])), nil
}

// up starts answering on the socket; down stops (connections refused).
func (b *berthd) up(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("unix", b.sock)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.ln = ln
	b.mu.Unlock()
	go func() {
		_ = lazysrv.ServeRanges(context.Background(), ln, slog.New(slog.DiscardHandler), func(string) (lazy.Source, bool) { return b, true })
	}()
}

func (b *berthd) down() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ln != nil {
		b.ln.Close()
		b.ln = nil
	}
}

// rig is a lazy layer as berthd leaves it: its dir, mounted through
// fuseconn, the connection held by the test (in the keeper's place).
type rig struct {
	dir, mnt string
	blob     []byte
	dev      *os.File
	berthd   *berthd
}

func newRig(t *testing.T) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	blob, toc := testLayer(t)
	root := t.TempDir()
	dir := filepath.Join(root, "layer")
	r := &rig{dir: dir, mnt: filepath.Join(dir, lazysrv.MountDir), blob: blob,
		berthd: &berthd{blob: blob, sock: filepath.Join(root, "lazy.sock"), stalled: make(chan struct{}, 1), release: make(chan struct{})}}
	for _, d := range []string{r.mnt, filepath.Join(dir, lazysrv.CacheDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writeJSON(t, filepath.Join(dir, lazysrv.MetaFile), fmt.Sprintf(`{"blob":"sha256:x","size":%d,"tocDigest":%q,"socket":%q}`, len(blob), toc, r.berthd.sock))
	_, tocOff, _, err := new(estargz.GzipDecompressor).ParseFooter(blob[len(blob)-estargz.FooterSize:])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, lazysrv.TOCFile), blob[tocOff:], 0o600); err != nil {
		t.Fatal(err)
	}
	dev, s, err := fuseconn.Mount(r.mnt, &lazy.HeldOptions().MountOptions)
	if err != nil {
		t.Fatal(err)
	}
	r.dev = dev
	if err := s.Save(filepath.Join(dir, lazysrv.SettingsFile)); err != nil {
		t.Fatal(err)
	}
	if !s.CanResend() {
		t.Log("this kernel has no FUSE_NOTIFY_RESEND: a request a killed server took is never answered")
	}
	r.berthd.up(t)
	t.Cleanup(func() {
		r.berthd.down()
		// Aborts a connection a failed test left a reader blocked on.
		if err := fuseconn.Unmount(r.mnt); err != nil {
			t.Error(err)
		}
		dev.Close()
		if m := mountsAt(t, r.mnt); len(m) > 0 {
			t.Errorf("still mounted: %v", m)
		}
	})
	return r
}

func writeJSON(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// server is a lazy-layer server process started as the keeper starts
// one: the link on fd 3, the layer's connection handed on it.
type server struct {
	cmd  *exec.Cmd
	link int
	log  *bytes.Buffer
	done chan struct{}
}

func (r *rig) startServer(t *testing.T) *server {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(sp[1]), "link")
	s := &server{cmd: exec.Command(exe), link: sp[0], log: &bytes.Buffer{}, done: make(chan struct{})}
	s.cmd.Env = append(os.Environ(), roleEnv+"=server")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = pw
	s.cmd.ExtraFiles = []*os.File{theirs}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	pw.Close()
	var mu sync.Mutex
	go func() {
		defer close(s.done)
		data, _ := io.ReadAll(pr)
		pr.Close()
		mu.Lock()
		s.log.Write(data)
		mu.Unlock()
	}()
	t.Cleanup(func() {
		s.kill()
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() {
			t.Logf("server %d log:\n%s", s.cmd.Process.Pid, s.log)
		}
	})
	if err := proto.SendKeeperMsg(s.link, &proto.KeeperMsg{Op: proto.KeeperLazyHold, ID: "sha256:layer", Dir: r.dir}, []int{int(r.dev.Fd())}); err != nil {
		t.Fatal(err)
	}
	if err := proto.SendKeeperMsg(s.link, &proto.KeeperMsg{Op: proto.KeeperAdopted}, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// kill ends the server with SIGKILL, as a crash would, and reaps it.
func (s *server) kill() {
	if s.link >= 0 {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		_ = s.cmd.Wait()
		<-s.done
		unix.Close(s.link)
		s.link = -1
	}
}

// stop drops the layer and closes the link, as the keeper does when it
// holds no layer: the server exits, cleanly.
func (s *server) stop(t *testing.T) {
	t.Helper()
	if err := proto.SendKeeperMsg(s.link, &proto.KeeperMsg{Op: proto.KeeperLazyDrop, ID: "sha256:layer"}, nil); err != nil {
		t.Fatal(err)
	}
	unix.Close(s.link)
	s.link = -1
	if err := s.cmd.Wait(); err != nil {
		t.Errorf("server at the end of its link: %v", err)
	}
	<-s.done
}

// readAt reads n bytes of name in the mount at off, as a container would
// (another process than the server's and the test's, runReader); an
// error is the reader's stderr.
func (r *rig) readAt(name string, off int64, n int) ([]byte, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, filepath.Join(r.mnt, name), fmt.Sprint(off), fmt.Sprint(n))
	cmd.Env = append(os.Environ(), roleEnv+"=reader")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (r *rig) wantWeights(t *testing.T, off int64, n int) {
	t.Helper()
	got, err := r.readAt("data/weights", off, n)
	if err != nil || !bytes.Equal(got, weights[off:off+int64(n)]) {
		t.Fatalf("data/weights at %d: %d bytes, %v (want %d bytes, the layer's)", off, len(got), err, n)
	}
}

// A server killed (-9) is replaced by the next one the keeper starts on
// the connection it held: a reader blocked in a read the dead server had
// taken (its chunk being fetched from berthd) gets its answer, chunks
// read before are served from disk, chunks never read come from berthd,
// nobody sees ENOTCONN. With berthd away, a chunk on disk reads and one
// that is not fails with EIO after the bounded retries (no hang), and
// reads again once berthd is back. Once berthd says the layer is
// complete, the server writes its files out and reads need nobody. The
// mount then goes and leaves no process, mount or fd.
func TestServerOutlivesItsDeathOnAHeldConnection(t *testing.T) {
	fdsBefore := leakcheck.OwnFDs(t)
	r := newRig(t)
	s1 := r.startServer(t)

	r.wantWeights(t, 0, chunk)
	if n := r.berthd.requests.Load(); n == 0 {
		t.Fatal("the first chunk came from nowhere: berthd was not asked")
	}

	// A reader blocked in a read the server took.
	r.berthd.mu.Lock()
	r.berthd.stallNext = true
	r.berthd.mu.Unlock()
	type result struct {
		data []byte
		err  error
	}
	blocked := make(chan result, 1)
	go func() {
		got, err := r.readAt("data/weights", 5*chunk, chunk)
		blocked <- result{got, err}
	}()
	select {
	case <-r.berthd.stalled:
	case res := <-blocked:
		t.Fatalf("the read was answered before the server asked berthd: %d bytes, %v", len(res.data), res.err)
	}
	s1.kill()
	// The dead server's ask is gone; the next asks are answered.
	close(r.berthd.release)
	s2 := r.startServer(t)
	res := <-blocked
	if res.err != nil || !bytes.Equal(res.data, weights[5*chunk:6*chunk]) {
		t.Fatalf("the read blocked at the kill: %d bytes, %v", len(res.data), res.err)
	}
	r.wantWeights(t, 0, chunk)       // from the chunk cache
	r.wantWeights(t, 9*chunk, chunk) // never read: from berthd
	if got, err := r.readAt("etc/conf", 0, 64); err != nil || string(got) != "conf=1\n" {
		t.Fatalf("etc/conf: %q, %v", got, err)
	}

	// berthd away: what is on disk reads, the rest fails, bounded.
	r.berthd.down()
	asked := r.berthd.requests.Load()
	r.wantWeights(t, 9*chunk, chunk)
	if _, err := r.readAt("data/weights", 12*chunk, chunk); err == nil || !strings.Contains(err.Error(), syscall.EIO.Error()) {
		t.Fatalf("a chunk not on disk with berthd away: %v, want EIO", err)
	}
	if r.berthd.requests.Load() != asked {
		t.Fatal("berthd answered while it was down")
	}
	r.berthd.up(t)
	r.wantWeights(t, 12*chunk, chunk)

	// Complete: the blob on disk, the files written out by the server,
	// and berthd never asked again.
	blobPath := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(blobPath, r.blob, 0o600); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(r.dir, lazysrv.CompleteFile), fmt.Sprintf(`{"blobPath":%q,"unpacked":%d}`, blobPath, 2<<20))
	for {
		if st, err := os.Stat(filepath.Join(r.dir, lazysrv.CacheDir, "files")); err == nil && st.IsDir() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.berthd.down()
	asked = r.berthd.requests.Load()
	r.wantWeights(t, 0, len(weights))
	if r.berthd.requests.Load() != asked {
		t.Fatal("a complete layer asked berthd")
	}

	// Gone: unmounted by berthd, dropped by the keeper.
	if err := unix.Unmount(r.mnt, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	s2.stop(t)
	if m := mountsAt(t, r.mnt); len(m) > 0 {
		t.Errorf("still mounted: %v", m)
	}
	for _, pid := range leakcheck.Children(t) {
		t.Errorf("process %d left", pid)
	}
	r.dev.Close()
	if d := leakcheck.NewFDs(fdsBefore, leakcheck.OwnFDs(t)); len(d) > 0 {
		t.Errorf("fds left: %v", d)
	}
}

// holder is a runHolder process.
type holder struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// hold opens name in the mount in a holder process.
func (r *rig) hold(t *testing.T, name string) *holder {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: exec.Command(exe, filepath.Join(r.mnt, name))}
	h.cmd.Env = append(os.Environ(), roleEnv+"=holder")
	h.cmd.Stderr = os.Stderr
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = bufio.NewScanner(stdout)
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A test that failed may have left no server: the holder's close
		// would wait for one (FLUSH), until the rig's unmount aborts the
		// connection, which runs after this.
		if h.in != nil {
			h.in.Close()
			_ = h.cmd.Process.Kill()
			go func() { _ = h.cmd.Wait() }()
		}
	})
	if !h.out.Scan() || h.out.Text() != "open" {
		t.Fatalf("holder of %s: %q, %v", name, h.out.Text(), h.out.Err())
	}
	return h
}

// sum is the SHA-256 of the whole file read through the held open.
func (h *holder) sum(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(h.in, "read\n"); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for h.out.Scan() && h.out.Text() != "end" {
		lines = append(lines, h.out.Text())
	}
	if len(lines) != 1 {
		t.Fatalf("holder's read: %q, %v", lines, h.out.Err())
	}
	return lines[0]
}

// end closes the held file (the holder exits).
func (h *holder) end() {
	if h.in != nil {
		h.in.Close()
		_ = h.cmd.Wait()
		h.in = nil
	}
}

// complete makes the layer complete as berthd does (the blob on disk,
// complete.json) and waits for the server to write its files out.
func (r *rig) complete(t *testing.T) {
	t.Helper()
	blobPath := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(blobPath, r.blob, 0o600); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(r.dir, lazysrv.CompleteFile), fmt.Sprintf(`{"blobPath":%q,"unpacked":%d}`, blobPath, 2<<20))
	for {
		if st, err := os.Stat(filepath.Join(r.dir, lazysrv.CacheDir, "files")); err == nil && st.IsDir() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A file open across its server's death, in passthrough (opened once the
// layer's files were local: the kernel keeps the dead server's backing
// file on the inode) or in cached mode (opened before), reads on through
// its open, and new opens of it by the servers that follow succeed and
// read it whole (decision 3600, "Passthrough across servers"): before,
// the next server's own backing file (EBUSY) or passthrough open of a
// cached inode (ETXTBSY) made them fail with EIO.
func TestServerOpenFileOutlivesItsServer(t *testing.T) {
	want := fmt.Sprintf("%x", sha256.Sum256(weights))
	for _, tc := range []struct {
		name       string
		openBefore bool // opened before the layer was complete
	}{
		{name: "passthrough"},
		{name: "cached", openBefore: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fdsBefore := leakcheck.OwnFDs(t)
			r := newRig(t)
			s := r.startServer(t)
			if !tc.openBefore {
				r.complete(t)
			}
			h := r.hold(t, "data/weights")
			if got := h.sum(t); got != want {
				t.Fatalf("held open: %s, want %s", got, want)
			}
			if tc.openBefore {
				r.complete(t)
				r.wantWeights(t, 0, len(weights)) // a new open meanwhile
			}
			for range 2 {
				s.kill()
				s = r.startServer(t)
				r.wantWeights(t, 0, len(weights))
				r.wantWeights(t, 3*chunk, chunk)
				if got := h.sum(t); got != want {
					t.Fatalf("held open after the server's death: %s, want %s", got, want)
				}
			}
			h.end()
			r.wantWeights(t, 0, len(weights)) // nothing holds it now
			// The records of the connection: the held file's mode, and
			// its backing ID where the kernel passes files through (the
			// case of "passthrough"; not on a stacked /tmp: ELOOP).
			recs, err := os.ReadFile(filepath.Join(r.dir, lazysrv.BackingFile))
			if err != nil {
				t.Fatal(err)
			}
			// A 32-byte header, then one 16-byte record: node ID, backing
			// ID (0: cached mode), checksum.
			if len(recs) != 48 {
				t.Fatalf("backing records: %d bytes, want one record", len(recs))
			}
			switch id := binary.LittleEndian.Uint32(recs[40:]); {
			case tc.openBefore && id != 0:
				t.Fatalf("a file opened before completion recorded with backing ID %d", id)
			case !tc.openBefore && id == 0:
				t.Log("the kernel took no backing file here (no passthrough): only cached mode was tested")
			}
			r.berthd.down()

			if err := unix.Unmount(r.mnt, 0); err != nil {
				t.Fatalf("unmount: %v", err)
			}
			s.stop(t)
			for _, pid := range leakcheck.Children(t) {
				t.Errorf("process %d left", pid)
			}
			r.dev.Close()
			if d := leakcheck.NewFDs(fdsBefore, leakcheck.OwnFDs(t)); len(d) > 0 {
				t.Errorf("fds left: %v", d)
			}
		})
	}
}

// A layer whose dir no server can serve (here its FUSE settings are not
// a handshake) has its connection aborted by the server, though the
// keeper still holds the fd: a reader gets an answer, not a wait for
// ever: ECONNABORTED from the aborted connection (ENOTCONN on some
// kernels), or ENOENT when the forced unmount also took the mount away
// (nothing held it busy, unlike a container's overlay).
func TestServerAbortsALayerItCannotServe(t *testing.T) {
	r := newRig(t)
	writeJSON(t, filepath.Join(r.dir, lazysrv.SettingsFile), `{"init":"","reply":""}`)
	s := r.startServer(t)
	_, err := r.readAt("etc/conf", 0, 64)
	answered := false
	for _, e := range []syscall.Errno{syscall.ECONNABORTED, syscall.ENOTCONN, syscall.ENOENT} {
		answered = answered || err != nil && strings.Contains(err.Error(), e.Error())
	}
	if !answered {
		t.Fatalf("read of a layer no server can serve: %v, want ECONNABORTED, ENOTCONN or ENOENT", err)
	}
	s.stop(t)
	for _, pid := range leakcheck.Children(t) {
		t.Errorf("process %d left", pid)
	}
}

// mountsAt is the mount entries whose mount point is dir.
func mountsAt(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			out = append(out, line)
		}
	}
	return out
}
