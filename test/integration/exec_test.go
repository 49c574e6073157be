package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

func TestExecSyncOutputsExitCodesAndErrors(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	id := e.run(e.config("sleeper", "sleep", "3600"))

	r, err := execSync(t, e.d, id, 10, "echo", "hello")
	if err != nil || string(r.Stdout) != "hello\n" || r.ExitCode != 0 || len(r.Stderr) != 0 {
		t.Fatalf("echo hello: %+v, %v", r, err)
	}
	r, err = execSync(t, e.d, id, 10, "sh", "-c", "echo oops >&2; exit 3")
	if err != nil || string(r.Stderr) != "oops\n" || r.ExitCode != 3 {
		t.Fatalf("exit 3: %+v, %v", r, err)
	}
	// The exec'd process runs as the container does: same user and cwd.
	r, err = execSync(t, e.d, id, 10, "sh", "-c", "id -u; pwd")
	if err != nil || string(r.Stdout) != "0\n/\n" {
		t.Fatalf("identity: %+v, %v", r, err)
	}

	_, err = execSync(t, e.d, id, 10)
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	_, err = execSync(t, e.d, "nonexistent", 10, "true")
	berthdtest.WantCode(t, err, codes.NotFound)
	created := e.create(e.config("notstarted", "sleep", "3600"))
	_, err = execSync(t, e.d, created, 10, "true")
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
}

func TestExecSyncTimeoutKillsTheProcess(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	id := e.run(e.config("sleeper", "sleep", "3600"))
	start := time.Now()
	_, err := execSync(t, e.d, id, 1, "sleep", "4321")
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("timed-out exec took %s to return", took)
	}
	// The timed-out process is gone, as critest checks.
	r, err := execSync(t, e.d, id, 10, "sh", "-c", "ps -o args | grep 'sleep 4321' | grep -v grep; true")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(r.Stdout)) != "" {
		t.Fatalf("timed-out exec still running:\n%s", r.Stdout)
	}
}

// TestExecSyncTimeoutCountsFromTheProcessStart: the runtime's own setup
// of an exec (here a wrapper that takes 3 s before it runs runc exec, as
// runc does on a loaded node) is not the command's time: a `true` with a
// 1 s timeout succeeds, as under containerd, whose timer starts once the
// exec has started. It failed DeadlineExceeded when berthd's timer
// started with the runtime (CI: the cgroup v2 guest's probes under load).
func TestExecSyncTimeoutCountsFromTheProcessStart(t *testing.T) {
	t.Parallel()
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "slow-exec-runc")
	script := fmt.Sprintf(`#!/bin/sh
for a in "$@"; do
	[ "$a" = exec ] && sleep 3 && break
done
exec %q "$@"
`, runc)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.RuntimeHandlers = map[string]config.RuntimeHandler{"runc": {Binary: wrapper}}
	}})
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("sleeper", "sleep", "3600"))
	r, err := execSync(t, e.d, id, 1, "true")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("true with a 1 s timeout behind a 3 s runtime setup: %+v, %v", r, err)
	}
	// The timeout still ends a command that runs past it.
	_, err = execSync(t, e.d, id, 1, "sleep", "4321")
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
}

func TestExecSyncCapsOutputAt16MiB(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	id := e.run(e.config("sleeper", "sleep", "3600"))
	r, err := e.d.Runtime.ExecSync(berthdtest.Ctx(t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", "head -c 20000000 /dev/zero"}, Timeout: 30},
		grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Stdout) != 16<<20 || r.ExitCode != 0 {
		t.Fatalf("stdout %d bytes, exit %d; want %d bytes, exit 0", len(r.Stdout), r.ExitCode, 16<<20)
	}
}

// executor is the client side kubectl and critest use.
func executor(t *testing.T, transport, rawURL string) remotecommand.Executor {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	var ex remotecommand.Executor
	switch transport {
	case "spdy":
		ex, err = remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	case "websocket":
		// The kubelet streaming library speaks the v4 channel protocol.
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(&rest.Config{}, "GET", rawURL, "v4.channel.k8s.io")
	}
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

func TestExecStreamsOverSPDYAndWebsocket(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	id := e.run(e.config("sleeper", "sleep", "3600"))
	for _, transport := range []string{"spdy", "websocket"} {
		t.Run(transport, func(t *testing.T) {
			// stdin piped through, stdout and stderr apart. The v4
			// websocket protocol cannot signal the end of stdin (v5 added
			// that), so there the command reads one line only.
			cmd := []string{"sh", "-c", "cat; echo done >&2"}
			if transport == "websocket" {
				cmd = []string{"sh", "-c", "read line; echo $line; echo done >&2"}
			}
			resp, err := e.d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{ContainerId: id, Cmd: cmd, Stdin: true, Stdout: true, Stderr: true})
			if err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			err = executor(t, transport, resp.Url).StreamWithContext(berthdtest.Ctx(t), remotecommand.StreamOptions{
				Stdin: strings.NewReader("piped input\n"), Stdout: &out, Stderr: &errOut,
			})
			if err != nil || out.String() != "piped input\n" || errOut.String() != "done\n" {
				t.Fatalf("exec with stdin: err %v, stdout %q, stderr %q", err, out.String(), errOut.String())
			}

			// A non-zero exit reaches the client as its code.
			resp, err = e.d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{ContainerId: id, Cmd: []string{"sh", "-c", "exit 7"}, Stdout: true, Stderr: true})
			if err != nil {
				t.Fatal(err)
			}
			err = executor(t, transport, resp.Url).StreamWithContext(berthdtest.Ctx(t), remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
			var exitErr utilexec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitStatus() != 7 {
				t.Fatalf("exit 7 reached the client as %v", err)
			}

			// A TTY: one output stream, the terminal size applied.
			resp, err = e.d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{ContainerId: id, Cmd: []string{"sh", "-c", `for i in $(seq 50); do s=$(stty size 2>/dev/null); [ "$s" = "33 101" ] && break; sleep 0.1; done; echo "size $s"; test -t 0 && echo tty`}, Stdin: true, Stdout: true, Tty: true})
			if err != nil {
				t.Fatal(err)
			}
			out.Reset()
			sizes := &fixedSize{size: remotecommand.TerminalSize{Width: 101, Height: 33}}
			err = executor(t, transport, resp.Url).StreamWithContext(berthdtest.Ctx(t), remotecommand.StreamOptions{
				Stdin: &blockingReader{done: make(chan struct{})}, Stdout: &out, Tty: true, TerminalSizeQueue: sizes,
			})
			if err != nil {
				t.Fatalf("tty exec: %v (output %q)", err, out.String())
			}
			if got := strings.ReplaceAll(out.String(), "\r", ""); !strings.Contains(got, "size 33 101") || !strings.Contains(got, "tty") {
				t.Fatalf("tty exec output %q; want the size 33 101 and tty", got)
			}
		})
	}
}

// fixedSize hands out one terminal size, then blocks until the session ends.
type fixedSize struct {
	once sync.Once
	size remotecommand.TerminalSize
}

func (f *fixedSize) Next() *remotecommand.TerminalSize {
	var s *remotecommand.TerminalSize
	f.once.Do(func() { s = &f.size })
	if s == nil {
		time.Sleep(time.Hour)
	}
	return s
}

// blockingReader is a stdin that never sends anything.
type blockingReader struct{ done chan struct{} }

func (b *blockingReader) Read([]byte) (int, error) { <-b.done; return 0, errors.New("closed") }

func TestExecAndAttachRejectBadRequests(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	created := e.create(e.config("notstarted", "sleep", "3600"))
	ctx := berthdtest.Ctx(t)
	_, err := e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: created, Cmd: []string{"true"}, Stdout: true})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	_, err = e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: "nonexistent", Cmd: []string{"true"}, Stdout: true})
	berthdtest.WantCode(t, err, codes.NotFound)
	_, err = e.d.Runtime.Exec(ctx, &criapi.ExecRequest{ContainerId: created, Stdout: true})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	_, err = e.d.Runtime.Attach(ctx, &criapi.AttachRequest{ContainerId: created, Stdout: true})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	_, err = e.d.Runtime.Attach(ctx, &criapi.AttachRequest{ContainerId: "nonexistent", Stdout: true})
	berthdtest.WantCode(t, err, codes.NotFound)
}

func TestAttachReadsOutputAndSendsInput(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("echoer", "sh", "-c", "while read line; do echo got:$line; done")
	cfg.Stdin = true
	id := e.run(cfg)
	for _, transport := range []string{"spdy", "websocket"} {
		t.Run(transport, func(t *testing.T) {
			resp, err := e.d.Runtime.Attach(berthdtest.Ctx(t), &criapi.AttachRequest{ContainerId: id, Stdin: true, Stdout: true, Stderr: true})
			if err != nil {
				t.Fatal(err)
			}
			inR, inW := ioPipe()
			out := &syncBuffer{}
			ctx, cancel := context.WithCancel(berthdtest.Ctx(t))
			done := make(chan error, 1)
			go func() {
				done <- executor(t, transport, resp.Url).StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: inR, Stdout: out, Stderr: out})
			}()
			fmt.Fprintf(inW, "hello %s\n", transport)
			waitUntil(t, "the echo of the input over "+transport, func() bool { return strings.Contains(out.String(), "got:hello "+transport) })
			cancel()
			inW.Close()
			<-done
		})
	}
}

// TestExecSyncLeaksNothing runs many exec probes and checks that berthd and
// the shim keep their fd and goroutine counts and that no zombie remains.
func TestExecSyncLeaksNothing(t *testing.T) {
	t.Parallel()
	const calls = 1000
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.MetricsAddress = "127.0.0.1:0" }})
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("probe-target", "sleep", "3600"))
	probe := func() {
		r, err := execSync(t, d, id, 10, "true")
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("exec probe: %+v, %v", r, err)
		}
	}
	for i := 0; i < 20; i++ { // warm up pools and caches
		probe()
	}
	shim := shimPid(t, d)
	fds0, fdsShim0, gr0 := countFDs(t, d.Pid()), countFDs(t, shim), goroutines(t, d)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := 0; i < calls; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); defer func() { <-sem }(); probe() }()
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	fds1, fdsShim1, gr1 := countFDs(t, d.Pid()), countFDs(t, shim), goroutines(t, d)
	if fds1 > fds0+5 || fdsShim1 > fdsShim0+2 {
		t.Errorf("fds grew over %d execs: berthd %d → %d, shim %d → %d", calls, fds0, fds1, fdsShim0, fdsShim1)
	}
	if gr1 > gr0+10 {
		t.Errorf("goroutines grew over %d execs: %d → %d", calls, gr0, gr1)
	}
	if z := zombies(t, d.Pid(), shim); len(z) > 0 {
		t.Errorf("zombies after %d execs: %v", calls, z)
	}
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// shimPid finds the berth-shim monitor serving this daemon's pods.
func shimPid(t *testing.T, d *berthdtest.Daemon) int {
	t.Helper()
	for _, pid := range berthdtest.PidsMentioning(d.State) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.TrimSpace(string(comm)) == "berth-shim" && strings.Contains(string(cmd), "\x00monitor\x00") {
			return pid
		}
	}
	t.Fatal("no berth-shim monitor for this daemon")
	return 0
}

// zombies lists zombie children of the given processes.
func zombies(t *testing.T, parents ...int) []string {
	t.Helper()
	isParent := map[string]bool{}
	for _, p := range parents {
		isParent[strconv.Itoa(p)] = true
	}
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndex(s, ") ")
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+2:]) // state, ppid, ...
		if len(f) > 1 && f[0] == "Z" && isParent[f[1]] {
			out = append(out, s[:i+1])
		}
	}
	return out
}

func ioPipe() (*io.PipeReader, *io.PipeWriter) { return io.Pipe() }

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key.
func selfSignedCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "berth-streaming"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return certFile, keyFile
}

func TestExecOverTLSStreamingServer(t *testing.T) {
	t.Parallel()
	cert, key := selfSignedCert(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.StreamingTLSCert, c.StreamingTLSKey = cert, key
	}})
	e := newCtrEnvOn(t, d)
	id := e.run(e.config("sleeper", "sleep", "3600"))
	resp, err := d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{ContainerId: id, Cmd: []string{"echo", "over tls"}, Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Url, "https://127.0.0.1:") {
		t.Fatalf("exec URL %q is not https", resp.Url)
	}
	u, _ := url.Parse(resp.Url)
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: cert}}, "POST", u)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := ex.StreamWithContext(berthdtest.Ctx(t), remotecommand.StreamOptions{Stdout: &out}); err != nil || out.String() != "over tls\n" {
		t.Fatalf("exec over TLS: %v, output %q", err, out.String())
	}
}
