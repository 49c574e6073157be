package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// Endpoint is one CRI runtime under measurement. Workloads use only these
// clients, so the same code measures berth and any reference runtime.
type Endpoint struct {
	Name    string
	Runtime criapi.RuntimeServiceClient
	Image   criapi.ImageServiceClient
	// Pids returns the runtime's own processes (daemon and helpers such
	// as shims) for memory accounting.
	Pids func() []int
	// Dir is a scratch directory for pod log directories.
	Dir string
	// Daemon is the berthd under test; nil for other runtimes.
	Daemon *berthdtest.Daemon
	// Socket is the CRI endpoint (unix://...), for a kubelet to use.
	Socket string
}

// StartBerth starts a berthd for the benchmark.
func StartBerth(tb testing.TB) *Endpoint { return StartBerthWith(tb, "berth", nil) }

// StartBerthWith starts a berthd named name whose configuration configure
// changes (nil: the defaults).
func StartBerthWith(tb testing.TB, name string, configure func(*config.Config)) *Endpoint {
	tb.Helper()
	d := berthdtest.Start(tb, berthdtest.Options{Configure: configure})
	return &Endpoint{
		Name:    name,
		Runtime: d.Runtime,
		Image:   d.Image,
		Dir:     d.Dir,
		Daemon:  d,
		Socket:  "unix://" + d.Socket,
		Pids: func() []int {
			pids := []int{d.Pid()}
			return append(pids, processesNamed("berth-shim", "berth-pause")...)
		},
	}
}

// StartReference connects to the reference runtime: $BENCH_REF_ENDPOINT
// when set (e.g. unix:///run/containerd/containerd.sock), else another
// build of berthd when $BENCH_REF_BERTHD names one (a before/after
// comparison, sample by sample), else a private containerd when the
// binary is installed, else nil.
// More registry hosts (plain HTTP on loopback) may follow registryHost.
func StartReference(tb testing.TB, registryHost string, more ...string) *Endpoint {
	tb.Helper()
	if bin := os.Getenv("BENCH_REF_BERTHD"); bin != "" {
		return startOtherBerthd(tb, bin)
	}
	if ep := os.Getenv("BENCH_REF_ENDPOINT"); ep != "" {
		rt, img := dial(tb, ep)
		return &Endpoint{Name: "reference", Runtime: rt, Image: img, Dir: tb.TempDir(), Socket: ep, Pids: func() []int { return nil }}
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		tb.Logf("no reference runtime: containerd not installed and BENCH_REF_ENDPOINT unset")
		return nil
	}
	return startContainerd(tb, registryHost, more...)
}

// startOtherBerthd runs the berthd binary bin (with the berth-shim and
// berth-pause next to it) as the reference.
func startOtherBerthd(tb testing.TB, bin string) *Endpoint {
	tb.Helper()
	d := berthdtest.Start(tb, berthdtest.Options{StartProcess: func(cmd *exec.Cmd) error {
		cmd.Path, cmd.Args[0] = bin, bin
		// A build older than a config table refuses it as unknown keys;
		// their defaults are what such a build does anyway.
		for _, table := range []string{"tracing", "image_lazy_pull"} {
			if err := dropTable(cmd.Args[2], table); err != nil {
				return err
			}
		}
		return cmd.Start()
	}})
	return &Endpoint{
		Name: "reference", Runtime: d.Runtime, Image: d.Image, Dir: d.Dir, Daemon: d, Socket: "unix://" + d.Socket,
		Pids: func() []int { return []int{d.Pid()} },
	}
}

func dial(tb testing.TB, endpoint string) (criapi.RuntimeServiceClient, criapi.ImageServiceClient) {
	tb.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatalf("dial %s: %v", endpoint, err)
	}
	tb.Cleanup(func() { conn.Close() })
	return criapi.NewRuntimeServiceClient(conn), criapi.NewImageServiceClient(conn)
}

// startContainerd runs containerd on private root/state/socket with its own
// CNI bridge, and a pause image from the benchmark's local registry.
func startContainerd(tb testing.TB, registryHost string, more ...string) *Endpoint {
	tb.Helper()
	dir, err := os.MkdirTemp("", "bench-ctrd-")
	if err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	netd := filepath.Join(dir, "net.d")
	os.MkdirAll(netd, 0o755)
	suffix := fmt.Sprintf("%d", os.Getpid()%1000)
	conflist := fmt.Sprintf(`{"cniVersion":"0.4.0","name":"benchref","plugins":[
 {"type":"bridge","bridge":"bref%s","isGateway":true,"ipMasq":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/16"}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":"%s/ipam"}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}`, suffix, dir)
	if err := os.WriteFile(filepath.Join(netd, "10-bench.conflist"), []byte(conflist), 0o644); err != nil {
		tb.Fatal(err)
	}
	cfg := fmt.Sprintf(`version = 2
root = "%[1]s/root"
state = "%[1]s/state"
[grpc]
  address = "%[2]s"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[3]s/pause:latest"
  # Without CAP_SYS_RESOURCE the pause container's -998 is refused.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "%[4]s"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."%[3]s"]
    endpoint = ["http://%[3]s"]
`, dir, sock, registryHost, netd)
	for _, h := range more {
		cfg += fmt.Sprintf(`  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."%[1]s"]
    endpoint = ["http://%[1]s"]
`, h)
	}
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	logf, _ := os.Create(filepath.Join(dir, "containerd.log"))
	cmd := exec.Command("containerd", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start containerd: %v", err)
	}
	tb.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		for _, pid := range berthdtest.PidsMentioning(dir) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		berthdtest.UnmountBelow(dir)
		os.RemoveAll(dir)
		// The bridge plugin never deletes its bridge; one per run would pile up.
		_ = exec.Command("ip", "link", "del", "bref"+suffix).Run()
	})
	rt, img := dial(tb, "unix://"+sock)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := rt.Version(ctx, &criapi.VersionRequest{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			tb.Fatalf("containerd not ready: %v\n%s", err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &Endpoint{
		Name: "containerd", Runtime: rt, Image: img, Dir: dir, Socket: "unix://" + sock,
		Pids: func() []int {
			return append([]int{cmd.Process.Pid}, processesMentioning("containerd-shim", dir)...)
		},
	}
}

// processesNamed lists processes whose comm is one of names.
func processesNamed(names ...string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		c := strings.TrimSpace(string(comm))
		for _, n := range names {
			if c == n {
				var pid int
				fmt.Sscan(e.Name(), &pid)
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// processesMentioning lists processes whose command line contains all of words.
func processesMentioning(words ...string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(string(cmdline), w)
		}
		if ok {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			pids = append(pids, pid)
		}
	}
	return pids
}

// PSSKiB sums the proportional set size of pids (shared pages divided
// among their users), from /proc/PID/smaps_rollup.
func PSSKiB(pids []int) uint64 {
	var total uint64
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "Pss:") {
				var kb uint64
				fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(line, "Pss:")), &kb)
				total += kb
			}
		}
	}
	return total
}

// dropTable removes the TOML table [name] from the config file at path, so
// that a berthd built before that table existed (BENCH_REF_BERTHD) reads
// the file; its defaults are what that build does anyway.
func dropTable(path, name string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config for the reference berthd: %w", err)
	}
	var out []string
	skip := false
	for _, line := range strings.Split(string(data), "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "[") {
			skip = t == "["+name+"]" || strings.HasPrefix(t, "["+name+".")
		}
		if !skip {
			out = append(out, line)
		}
	}
	return os.WriteFile(path, []byte(strings.Join(out, "\n")), 0o600)
}
