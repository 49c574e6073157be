// Package berthdtest starts a real berthd binary for integration tests, on a
// private root, state dir, socket and cgroup parent, and cleans up everything
// it made afterwards: processes, mounts, cgroups and files.
package berthdtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
)

// Options adjust the daemon a test starts.
type Options struct {
	// Configure edits the generated config before it is written.
	Configure func(*config.Config)
	// Args are extra berthd flags.
	Args []string
	// Env is appended to the daemon's environment (fault-injection hooks).
	Env []string
	// StartProcess, when set, starts the prepared berthd command instead of
	// cmd.Start (to run it in other namespaces, e.g. beside a private
	// systemd). It may change cmd before starting it.
	StartProcess func(cmd *exec.Cmd) error
}

// Environment variables that pick what every test daemon runs with (the
// cgroup v2 guest lane, docs/decisions/2200-cgroup-v2-guest-lane.md):
//
//	BERTH_TEST_CGROUP_DRIVER  cgroupfs or systemd (needs a running systemd)
//	BERTH_TEST_RUNTIME        the default runtime handler's binary, e.g. crun
//	BERTH_TEST_OCI_VERSION    that handler's oci_version (Debian's crun: 1.0.2)
const (
	EnvCgroupDriver = "BERTH_TEST_CGROUP_DRIVER"
	EnvRuntime      = "BERTH_TEST_RUNTIME"
	EnvOCIVersion   = "BERTH_TEST_OCI_VERSION"
)

// Daemon is one berthd subprocess with CRI clients connected to it.
type Daemon struct {
	Dir        string // scratch dir holding everything below
	Root       string
	State      string
	Socket     string
	ConfigPath string
	Config     *config.Config

	Runtime criapi.RuntimeServiceClient
	Image   criapi.ImageServiceClient

	t    testing.TB
	opts Options
	conn *grpc.ClientConn

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
	err  error         // cmd's exit error, valid after done
	logs *lockedBuffer

	netSlot *netSlot
}

// Start launches berthd and waits until it answers Version. The daemon and
// everything it made are torn down when the test ends.
func Start(t testing.TB, opts Options) *Daemon {
	t.Helper()
	RequireRoot(t)
	// Short paths: unix socket names are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "berth-")
	if err != nil {
		t.Fatalf("create scratch dir: %v", err)
	}
	d := &Daemon{
		Dir:        dir,
		Root:       filepath.Join(dir, "root"),
		State:      filepath.Join(dir, "state"),
		Socket:     filepath.Join(dir, "berth.sock"),
		ConfigPath: filepath.Join(dir, "berth.toml"),
		t:          t,
		opts:       opts,
		logs:       &lockedBuffer{},
	}
	cfg := config.Default()
	cfg.Listen = "unix://" + d.Socket
	cfg.Root = d.Root
	cfg.State = d.State
	cfg.CNIConfDir = filepath.Join(dir, "net.d")
	cfg.RegistryConfigDir = filepath.Join(dir, "certs.d")
	// Never the node's /etc/berth/policy.json; absent: accept anything.
	cfg.SignaturePolicy = filepath.Join(dir, "policy.json")
	cfg.LogLevel = "debug"
	cfg.CgroupParent = "berthtest-" + filepath.Base(dir)
	// A bridge and subnet of its own for the embedded default network, so
	// parallel test daemons never share them.
	slot, err := allocNetSlot()
	if err != nil {
		t.Fatalf("allocate test network: %v", err)
	}
	d.netSlot = slot
	cfg.DefaultNetwork.Bridge, cfg.DefaultNetwork.Subnet = slot.Bridge, slot.Subnet
	// NRI on a socket (and plugin dirs) of its own: parallel daemons must
	// never share /var/run/nri/nri.sock or start the node's plugins.
	cfg.NRI.SocketPath = filepath.Join(dir, "nri.sock")
	cfg.NRI.PluginPath = filepath.Join(dir, "nri-plugins")
	cfg.NRI.PluginConfigPath = filepath.Join(dir, "nri-conf.d")
	// The lane's choices (the cgroup v2 guest runs the same tests under
	// each driver and runtime); a test's Configure still has the last word.
	if v := os.Getenv(EnvCgroupDriver); v != "" {
		cfg.CgroupDriver = v
	}
	if v := os.Getenv(EnvRuntime); v != "" {
		cfg.Runtime = v
		cfg.RuntimeHandlers[cfg.DefaultRuntimeHandler] = config.RuntimeHandler{Binary: v, OCIVersion: os.Getenv(EnvOCIVersion)}
	}
	if opts.Configure != nil {
		opts.Configure(cfg)
	}
	d.Config = cfg
	d.Socket = cfg.SocketPath()
	data, err := cfg.TOML()
	if err != nil {
		t.Fatalf("encode config: %v", err)
	}
	if err := os.WriteFile(d.ConfigPath, data, 0o644); err != nil {
		t.Fatalf("write config: %v", err)
	}
	t.Cleanup(d.cleanup)
	d.Start()

	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial berthd: %v", err)
	}
	d.conn = conn
	d.Runtime = criapi.NewRuntimeServiceClient(conn)
	d.Image = criapi.NewImageServiceClient(conn)
	d.WaitReady()
	return d
}

// Start launches the berthd process (again, after Stop or Kill) without
// waiting for it to serve; pair it with WaitReady.
func (d *Daemon) Start() {
	d.t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		select {
		case <-d.done:
		default:
			d.t.Fatalf("berthd already running")
		}
	}
	args := append([]string{"--config", d.ConfigPath}, d.opts.Args...)
	cmd := exec.Command(Binary(d.t), args...)
	cmd.Env = append(withCRIUPath(os.Environ()), d.opts.Env...)
	cmd.Stdout = d.logs
	cmd.Stderr = d.logs
	// Own process group, so a test's ^C does not reach it first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := cmd.Start
	if d.opts.StartProcess != nil {
		start = func() error { return d.opts.StartProcess(cmd) }
	}
	if err := start(); err != nil {
		d.t.Fatalf("start berthd: %v", err)
	}
	fmt.Fprintf(d.logs, "=== berthd started, pid %d\n", cmd.Process.Pid)
	done := make(chan struct{})
	d.cmd, d.done = cmd, done
	go func() {
		err := cmd.Wait()
		d.mu.Lock()
		d.err = err
		d.mu.Unlock()
		close(done)
	}()
}

// readyBound is how long WaitReady lets berthd start: a bound that finds
// a berthd that never serves, not a measure of its speed (make bench has
// that). Its start forks the runtime's features probe, the user-namespace
// probe and iptables, each ~19× slower in the cgroup v2 guest's TCG, where
// beside other work a start takes over 30 s (docs/reliability.md).
const readyBound = 3 * time.Minute

// WaitReady waits until the daemon answers Version, failing the test if it
// exits first or does not serve within readyBound.
func (d *Daemon) WaitReady() {
	d.t.Helper()
	deadline := time.Now().Add(readyBound)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.Runtime.Version(ctx, &criapi.VersionRequest{})
		cancel()
		if err == nil {
			return
		}
		select {
		case <-d.done:
			d.t.Fatalf("berthd exited before serving (%v); logs:\n%s", d.ExitErr(), d.Logs())
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("berthd not ready after %s: %v; logs:\n%s", readyBound, err, d.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the running daemon's process ID.
func (d *Daemon) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd.Process.Pid
}

// Stop sends SIGTERM and waits for a clean exit; it fails the test if berthd
// exits non-zero or takes more than 40 s.
func (d *Daemon) Stop() {
	d.t.Helper()
	if err := d.signalAndWait(syscall.SIGTERM, 40*time.Second); err != nil {
		d.t.Fatalf("berthd did not stop cleanly: %v; logs:\n%s", err, d.Logs())
	}
}

// SetEnv replaces Options.Env for the next Start (arm or disarm fault
// points between restarts).
func (d *Daemon) SetEnv(env ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.opts.Env = env
}

// Kill sends SIGKILL, as a crash would, and waits for the process to go.
func (d *Daemon) Kill() {
	d.t.Helper()
	_ = d.signalAndWait(syscall.SIGKILL, 10*time.Second)
}

// Restart kills the daemon abruptly and starts it again on the same root.
func (d *Daemon) Restart() {
	d.t.Helper()
	d.Kill()
	d.Start()
	d.WaitReady()
}

// Exited returns a channel closed when the daemon process exits.
func (d *Daemon) Exited() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}

// ExitErr is the process's exit error once it has exited (nil for exit 0).
func (d *Daemon) ExitErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

func (d *Daemon) signalAndWait(sig syscall.Signal, timeout time.Duration) error {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return d.ExitErr()
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return d.ExitErr()
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("timed out after %s waiting for exit on %s", timeout, sig)
	}
}

// Logs returns everything berthd has written so far.
func (d *Daemon) Logs() string { return d.logs.String() }

func (d *Daemon) cleanup() {
	if d.conn != nil {
		d.conn.Close()
	}
	d.Kill()
	if d.t.Failed() {
		d.t.Logf("berthd logs:\n%s", d.Logs())
	}
	if err := CleanupNode(d.Dir, d.Config.CgroupParent); err != nil {
		d.t.Errorf("clean up after berthd: %v", err)
	}
	if err := d.netSlot.release(); err != nil {
		d.t.Errorf("clean up pod network: %v", err)
	}
}

// RequireRoot skips the test unless it runs as root on Linux: berthd needs
// namespaces, mounts and cgroups.
func RequireRoot(t testing.TB) {
	t.Helper()
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("integration tests need root on Linux")
	}
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// Binary returns the berthd binary under test: $BERTHD_BIN when set (make
// test builds it once), else one built from this checkout on first use.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("BERTHD_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berthd-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath, buildErr = BuildCommand(dir, "berthd")
		if buildErr == nil {
			// Helpers berthd finds next to its own binary.
			_, buildErr = BuildCommand(dir, "berth-pause")
			if buildErr == nil {
				// berthd runs the berth-shim next to its own binary.
				_, buildErr = BuildShim(dir)
			}
		}
	})
	if buildErr != nil {
		t.Fatalf("build berthd: %v", buildErr)
	}
	return buildPath
}

// BuildCommand builds ./cmd/<name> of this module into dir.
func BuildCommand(dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	cmd.Dir = moduleRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, b)
	}
	return out, nil
}

// BuildShim builds ./cmd/berth-shim into dir without cgo: a static binary
// maps no libc and starts no pthreads, which keeps the node's keeper and
// monitor small. berth-lazy, which the keeper starts from beside its own
// binary (decision 3600), is built with it.
func BuildShim(dir string) (string, error) {
	for _, name := range []string{"berth-shim", "berth-lazy"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), "./cmd/"+name)
		cmd.Dir = moduleRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, b)
		}
	}
	return filepath.Join(dir, "berth-shim"), nil
}

// CRIUDir is the directory of the criu the tests use: the one provided
// beside the checkout (../shared/tools/criu, where CI copies the shared
// tools; Debian's criu does not run on these machines' kernels), or ""
// when there is none and criu comes from PATH.
func CRIUDir() string {
	dir := filepath.Join(moduleRoot(), "..", "shared", "tools", "criu")
	if _, err := os.Stat(filepath.Join(dir, "criu")); err != nil {
		return ""
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	return abs
}

// withCRIUPath puts CRIUDir first on env's PATH, as make test does.
func withCRIUPath(env []string) []string {
	dir := CRIUDir()
	if dir == "" {
		return env
	}
	out := make([]string, 0, len(env)+1)
	found := false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			kv, found = "PATH="+dir+":"+v, true
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, "PATH="+dir+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	return out
}

// RequireCRIU skips the test, saying why, unless the criu berthd will
// run (CRIUDir's, else PATH's) passes `criu check`.
func RequireCRIU(t testing.TB) {
	t.Helper()
	path := ""
	if dir := CRIUDir(); dir != "" {
		path = filepath.Join(dir, "criu")
	} else if p, err := exec.LookPath("criu"); err == nil {
		path = p
	} else {
		t.Skipf("checkpoint/restore needs criu: %v", err)
	}
	if out, err := exec.Command(path, "check").CombinedOutput(); err != nil {
		t.Skipf("checkpoint/restore needs a working criu: %s check: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
}

func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Clone(b.buf.String())
}
