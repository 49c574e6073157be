package security

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// The streaming server's leak and allocation classes (issue 34): exec with
// a terminal and a resize storm (CVE-2022-23471), attach churn
// (CVE-2025-64329), and SPDY frames whose counts and compressed header
// blocks are chosen by the client (CVE-2026-35469 and the zlib bomb). Each
// test ends by checking that berthd's goroutines, descriptors and memory
// come back, with a generous settle time: a leak bound, not a speed test.

// slkEnv is a berthd with metrics (for go_goroutines) and one running
// container created with stdin, running cat (attach clients see what any
// of them sends).
type slkEnv struct {
	*phEnv
	metrics string // host:port of /metrics
	id      string // the container
}

func startSlkEnv(t *testing.T) *slkEnv {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	e := startPhEnv(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = addr }})
	pod, podID := e.runPod(t, "streamleaks", nil)
	ctr := e.container("cat", nil)
	ctr.Command = []string{"cat"}
	ctr.Stdin = true
	id := e.runContainer(t, podID, pod, ctr)
	return &slkEnv{phEnv: e, metrics: addr, id: id}
}

// slkUsage is what a leak would grow.
type slkUsage struct {
	goroutines, fds, rssKiB int
	children                int // berthd's child processes: runc execs still running
	monFds, monThreads      int
}

func (u slkUsage) String() string {
	return fmt.Sprintf("berthd: %d goroutines, %d fds, %d KiB RSS, %d children; monitor: %d fds, %d threads",
		u.goroutines, u.fds, u.rssKiB, u.children, u.monFds, u.monThreads)
}

func (e *slkEnv) usage(t *testing.T) slkUsage {
	t.Helper()
	u := slkUsage{goroutines: e.goroutines(t), fds: fdCount(t, e.d.Pid()), rssKiB: int(procKiB(t, e.d.Pid(), "VmRSS")),
		children: slkChildren(e.d.Pid())}
	for _, pid := range berthdtest.ShimPids(e.d.State, "monitor") {
		u.monFds += fdCount(t, pid)
		u.monThreads += slkThreads(t, pid)
	}
	return u
}

// goroutines scrapes go_goroutines from berthd's metrics.
func (e *slkEnv) goroutines(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + e.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("go_goroutines %q: %v", v, err)
			}
			return int(n)
		}
	}
	t.Fatal("no go_goroutines in berthd's metrics")
	return 0
}

// settle polls for up to 45 s until the sessions are over (no runc exec
// left under berthd) and berthd's descriptors and the monitor's
// descriptors and threads are back near base, and, when final, berthd's
// goroutines too; it fails the test with both if they never are, and
// returns the usage it settled at. A client that goes away while its
// streams are being set up leaves the library waiting for them until its
// 30 s stream-creation timeout (the kubelet's own bound), so goroutines
// are held to the baseline only at the end, with a slack far below one
// per session.
func (e *slkEnv) settle(t *testing.T, what string, base slkUsage, final bool) slkUsage {
	t.Helper()
	goroutineSlack := 200
	if final {
		goroutineSlack = 10
	}
	var now slkUsage
	for i := 0; i < 90; i++ {
		now = e.usage(t)
		if now.children <= base.children && now.fds <= base.fds+4 && now.goroutines <= base.goroutines+goroutineSlack &&
			now.monFds <= base.monFds+4 && now.monThreads <= base.monThreads+4 {
			t.Logf("%s: back to %v (baseline %v)", what, now, base)
			return now
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s: still %v after 45 s; baseline %v", what, now, base)
	return now
}

// slkSteadyRSS fails the test when a second round of the same sessions
// grew berthd's memory again: Go keeps freed heap for a while after the
// first burst (a plateau, not a leak), so the rounds are compared with
// each other: a leak grows again in the second round, a plateau does not.
func slkSteadyRSS(t *testing.T, first, second slkUsage) {
	t.Helper()
	// Between rounds RSS moves by up to ~50 MiB with the peak of the
	// burst; a leak of 1 MiB a session (about what a session's buffers
	// and goroutines weigh) would add 100 MiB or more per round.
	if grown := second.rssKiB - first.rssKiB; grown > 96<<10 {
		t.Fatalf("berthd's RSS grew by %d MiB in the second round (%d KiB after the first, %d KiB after the second)",
			grown>>10, first.rssKiB, second.rssKiB)
	}
}

// slkCut reports whether the client's cut (ctx's deadline) has come: an
// error then is the cut's (a dial may time out at the deadline a moment
// before ctx reports it).
func slkCut(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ctx.Err() != nil || (ok && !time.Now().Before(deadline))
}

// slkExecutor is client-go's SPDY executor, as kubectl uses.
func slkExecutor(t *testing.T, rawURL string) remotecommand.Executor {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// slkResizeStorm hands out a new terminal size on every call, 300 of
// them, and then nothing more until ctx ends.
type slkResizeStorm struct {
	ctx context.Context
	n   uint16
}

func (s *slkResizeStorm) Next() *remotecommand.TerminalSize {
	if s.n >= 300 { // enough to fill every buffer on the way; then wait
		<-s.ctx.Done()
	}
	if s.ctx.Err() != nil {
		return nil
	}
	s.n++
	return &remotecommand.TerminalSize{Width: 20 + s.n%200, Height: 10 + s.n%50}
}

// slkStdin sends data (if any), then holds stdin open until ctx ends.
type slkStdin struct {
	ctx  context.Context
	data []byte
}

func (s *slkStdin) Read(p []byte) (int, error) {
	if len(s.data) > 0 {
		n := copy(p, s.data)
		s.data = s.data[n:]
		return n, nil
	}
	<-s.ctx.Done()
	return 0, io.EOF
}

// slkLockedBuffer collects output written from the executor's goroutines.
type slkLockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *slkLockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *slkLockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// slkParallel runs n jobs, workers at a time, and fails on the first
// error any returns.
func slkParallel(t *testing.T, n, workers int, job func(i int) error) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := job(i); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("job %d: %w", i, err))
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// CVE-2022-23471 class: TTY execs whose client storms the server with
// resize events and then goes away mid-stream. Once the exec'd processes
// have ended, nothing of the sessions is left in berthd: no goroutine
// waiting to deliver a resize, no pty, no pipe.
func TestStreamingTTYExecResizeStormLeavesNothing(t *testing.T) {
	e := startSlkEnv(t)
	session := func(i int, cut time.Duration) error {
		resp, err := e.d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{
			ContainerId: e.id, Cmd: []string{"sh", "-c", "sleep 1"}, Tty: true, Stdin: true, Stdout: true,
		})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(berthdtest.Ctx(t), cut)
		defer cancel()
		out := &slkLockedBuffer{}
		err = slkExecutor(t, resp.Url).StreamWithContext(ctx, remotecommand.StreamOptions{
			Stdin: &slkStdin{ctx: ctx}, Stdout: out, Tty: true, TerminalSizeQueue: &slkResizeStorm{ctx: ctx},
		})
		if err != nil && !slkCut(ctx) {
			return fmt.Errorf("exec stream: %w (output %q)", err, out.String())
		}
		return nil
	}
	// Warm up: the first sessions start what berthd keeps for good.
	slkParallel(t, 4, 2, func(i int) error { return session(i, 3*time.Second) })
	time.Sleep(2 * time.Second)
	base := e.usage(t)
	t.Logf("baseline %v", base)

	const n = 60 // per round
	var rounds []slkUsage
	for round := 1; round <= 2; round++ {
		slkParallel(t, n, 10, func(i int) error {
			// Cut at different points: before, while and after the
			// streams are set up.
			return session(i, time.Duration(20+(i%10)*60)*time.Millisecond)
		})
		rounds = append(rounds, e.settle(t, fmt.Sprintf("round %d: %d resize-storm TTY execs cut mid-stream", round, n), base, round == 2))
	}
	slkSteadyRSS(t, rounds[0], rounds[1])
}

// CVE-2025-64329 class: attach churn on a running container with stdin.
// URLs that are never connected, sessions cut mid-stream, sessions that
// send stdin: afterwards berthd and the pod's monitor are back to their
// baseline, and the URLs never connected are bounded in number (the
// streaming library's request cache holds at most 1000, each for a
// minute, and holds no goroutine or descriptor for them).
func TestStreamingAttachChurnLeavesNothing(t *testing.T) {
	e := startSlkEnv(t)
	attach := func(stdin []byte, cut time.Duration, want string) error {
		resp, err := e.d.Runtime.Attach(berthdtest.Ctx(t), &criapi.AttachRequest{ContainerId: e.id, Stdin: true, Stdout: true, Stderr: true})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(berthdtest.Ctx(t), cut)
		defer cancel()
		out := &slkLockedBuffer{}
		err = slkExecutor(t, resp.Url).StreamWithContext(ctx, remotecommand.StreamOptions{
			Stdin: &slkStdin{ctx: ctx, data: stdin}, Stdout: out, Stderr: out,
		})
		if err != nil && !slkCut(ctx) {
			return fmt.Errorf("attach stream: %w", err)
		}
		if want != "" && !strings.Contains(out.String(), want) {
			return fmt.Errorf("attach with stdin %q: output %q, want it echoed", stdin, out.String())
		}
		return nil
	}
	slkParallel(t, 4, 2, func(i int) error { return attach([]byte("warm\n"), 2*time.Second, "warm") })
	time.Sleep(2 * time.Second)
	base := e.usage(t)
	t.Logf("baseline %v", base)

	const neverConnected = 150 // per round
	var rounds []slkUsage
	for round := 1; round <= 2; round++ {
		// URLs never connected: nothing but a cache entry each.
		for i := 0; i < neverConnected; i++ {
			if _, err := e.d.Runtime.Attach(berthdtest.Ctx(t), &criapi.AttachRequest{ContainerId: e.id, Stdin: true, Stdout: true}); err != nil {
				t.Fatalf("Attach %d: %v", i, err)
			}
		}
		// Sessions cut mid-stream, some while setting up.
		slkParallel(t, 75, 8, func(i int) error { return attach(nil, time.Duration(20+(i%10)*40)*time.Millisecond, "") })
		// Sessions that send stdin and see it come back (cat echoes it).
		slkParallel(t, 25, 4, func(i int) error {
			msg := fmt.Sprintf("ping-%d-%d\n", round, i)
			return attach([]byte(msg), 1500*time.Millisecond, strings.TrimSpace(msg))
		})
		rounds = append(rounds, e.settle(t, fmt.Sprintf("round %d of attach churn", round), base, round == 2))
	}
	slkSteadyRSS(t, rounds[0], rounds[1])

	// The never-connected URLs are bounded: the cache refuses more than
	// it holds instead of growing.
	refused := false
	for i := 2 * neverConnected; i < 1100; i++ {
		_, err := e.d.Runtime.Attach(berthdtest.Ctx(t), &criapi.AttachRequest{ContainerId: e.id, Stdin: true, Stdout: true})
		if err != nil {
			if status.Code(err) == codes.OK {
				t.Fatalf("Attach %d: %v", i, err)
			}
			t.Logf("Attach URL %d refused: %v", i, err)
			refused = true
			break
		}
	}
	if !refused {
		t.Fatal("1100 attach URLs never connected were all cached: the request cache is unbounded")
	}
	e.settle(t, "after filling the URL cache", base, true)
}

// CVE-2026-35469 class (moby/spdystream < 0.5.1) and the SPDY header zlib
// bomb: a client on an exec URL speaks raw SPDY. A SETTINGS frame that
// declares 2^31 entries, and a SYN_STREAM whose compressed header block
// inflates to hundreds of MiB, each get the connection closed, and
// berthd's peak memory does not follow the attacker's numbers.
func TestStreamingSPDYFrameBombsAreRefused(t *testing.T) {
	e := startSlkEnv(t)
	// One frame inflating to 400 MiB; and, each small enough for any
	// bound on a frame's size, eight frames of 40 MiB each on one
	// connection (one zlib stream across frames, as SPDY has it).
	var big, small []byte
	for i, block := range slkHeaderBombs(t, []int{400}, 1<<20) {
		big = append(big, slkControlFrame(1, 0, append(binary.BigEndian.AppendUint32(nil, uint32(2*i+1)), append([]byte{0, 0, 0, 0, 0, 0}, block...)...), 0)...)
	}
	for i, block := range slkHeaderBombs(t, []int{40, 40, 40, 40, 40, 40, 40, 40}, 1<<20) {
		if len(block) > 64<<10 {
			t.Fatalf("small bomb %d is %d bytes", i, len(block))
		}
		small = append(small, slkControlFrame(1, 0, append(binary.BigEndian.AppendUint32(nil, uint32(2*i+1)), append([]byte{0, 0, 0, 0, 0, 0}, block...)...), 0)...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"settings-2^31-entries", slkControlFrame(4, 0, binary.BigEndian.AppendUint32(make([]byte, 0, 12), 1<<31), 8)},
		{"syn-stream-zlib-bomb", big},
		{"syn-streams-small-zlib-bombs", small},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hwm := procKiB(t, e.d.Pid(), "VmHWM")
			resp, err := e.d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{ContainerId: e.id, Cmd: []string{"true"}, Stdout: true})
			if err != nil {
				t.Fatal(err)
			}
			conn := slkSPDYUpgrade(t, resp.Url)
			defer conn.Close()
			if _, err := conn.Write(tc.frame); err != nil {
				t.Logf("write: %v (the server may close before reading it all)", err)
			}
			// The server closes the connection (it may first send a
			// GOAWAY or RST_STREAM), well before the library's own
			// 30 s stream-creation timeout would.
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = io.Copy(io.Discard, conn)
			var ne net.Error
			stillOpen := errors.As(err, &ne) && ne.Timeout()
			if _, err := e.d.Runtime.Version(berthdtest.Ctx(t), &criapi.VersionRequest{}); err != nil {
				t.Fatalf("berthd after the hostile frame: %v", err)
			}
			grown := procKiB(t, e.d.Pid(), "VmHWM") - hwm
			t.Logf("berthd's peak RSS grew by %d KiB; connection still open after 10 s: %v", grown, stillOpen)
			if grown > 100<<10 {
				t.Errorf("berthd's peak RSS grew by %d MiB on one hostile frame", grown>>10)
			}
			if stillOpen {
				t.Errorf("the connection is still open 10 s after the hostile frame")
			}
		})
	}
}

// slkSPDYUpgrade upgrades a streaming URL to SPDY/3.1 by hand and returns
// the raw connection.
func slkSPDYUpgrade(t *testing.T, rawURL string) net.Conn {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n", u.RequestURI(), u.Host)
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	// Read the response byte by byte: nothing after it may be consumed.
	var head []byte
	b := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if _, err := conn.Read(b); err != nil {
			t.Fatalf("upgrade response: %v (so far %q)", err, head)
		}
		head = append(head, b[0])
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 101")) {
		t.Fatalf("upgrade answered %q", head)
	}
	_ = conn.SetReadDeadline(time.Time{})
	return conn
}

// slkControlFrame is a SPDY/3 control frame of typ carrying payload, its
// declared length extra bytes longer than the payload when extra > 0 (the
// frame then claims more than it sends).
func slkControlFrame(typ uint16, flags byte, payload []byte, extra int) []byte {
	f := binary.BigEndian.AppendUint16(nil, 0x8000|3)
	f = binary.BigEndian.AppendUint16(f, typ)
	f = binary.BigEndian.AppendUint32(f, uint32(flags)<<24|uint32(len(payload)+extra))
	return append(f, payload...)
}

// slkHeaderBombs are zlib-compressed SPDY/3 name/value blocks, one per
// entry of counts, of that many headers whose values are size bytes each:
// small on the wire, count*size inflated. They share one zlib stream, as
// the blocks of one connection do. (A stream without a preset dictionary
// is valid zlib: the reader uses the dictionary only when the stream asks
// for it.)
func slkHeaderBombs(t *testing.T, counts []int, size uint32) [][]byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zlib.NewWriterLevel(&buf, zlib.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte{'a'}, int(size))
	w := func(b []byte) {
		if _, err := zw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var blocks [][]byte
	for _, n := range counts {
		w(binary.BigEndian.AppendUint32(nil, uint32(n)))
		for i := 0; i < n; i++ {
			name := []byte(fmt.Sprintf("x-bomb-%04d", i))
			w(binary.BigEndian.AppendUint32(nil, uint32(len(name))))
			w(name)
			w(binary.BigEndian.AppendUint32(nil, size))
			w(value)
		}
		if err := zw.Flush(); err != nil {
			t.Fatal(err)
		}
		if buf.Len() >= 1<<24 {
			t.Fatalf("bomb of %d bytes does not fit a control frame", buf.Len())
		}
		blocks = append(blocks, bytes.Clone(buf.Bytes()))
		buf.Reset()
	}
	return blocks
}

// slkThreads counts pid's threads.
func slkThreads(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// slkChildren counts the processes whose parent is pid.
func slkChildren(pid int) int {
	entries, _ := os.ReadDir("/proc")
	n := 0
	for _, ent := range entries {
		data, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		i := strings.LastIndex(s, ") ")
		if i < 0 {
			continue
		}
		if f := strings.Fields(s[i+2:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}
