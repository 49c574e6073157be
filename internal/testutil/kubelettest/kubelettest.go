// Package kubelettest runs a real standalone kubelet (no API server:
// static pods from a manifest dir) on a CRI endpoint, for the kubelet
// tests (test/kubelet) and the full-node benchmark (bench): its config
// and flags for this kind of node, free ports, its cgroup root (cgroupfs
// or a systemd slice), waiting until it serves, static pod manifests,
// /pods from its read-only port, and the cleanup of what it leaves.
package kubelettest

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// BinDir returns the directory holding the Kubernetes programs named,
// built by hack/k8s-bins.sh (once; later calls find them in its cache).
// $BERTH_K8S_BIN_DIR names a directory that already holds them. A build
// that fails fails tb: a kubelet test that cannot get a kubelet must not
// pass by skipping.
func BinDir(tb testing.TB, progs ...string) string {
	tb.Helper()
	if dir := os.Getenv("BERTH_K8S_BIN_DIR"); dir != "" {
		for _, p := range progs {
			if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
				tb.Fatalf("BERTH_K8S_BIN_DIR=%s: %v", dir, err)
			}
		}
		return dir
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "hack", "k8s-bins.sh")
	start := time.Now()
	var stderr bytes.Buffer
	cmd := exec.Command(script, progs...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("hack/k8s-bins.sh %s: %v\n%s", strings.Join(progs, " "), err, stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		tb.Logf("hack/k8s-bins.sh %s took %s", strings.Join(progs, " "), d.Round(time.Second))
	}
	return strings.TrimSpace(string(out))
}

// FreePorts returns n distinct TCP ports free on loopback right now
// (held together, then freed for the caller).
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("find a free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Options say where a kubelet runs and what it talks to.
type Options struct {
	// Dir holds the kubelet's root dir, certs, manifests and logs.
	Dir string
	// Endpoint is the kubelet's --container-runtime-endpoint (unix://...).
	Endpoint string
	// CgroupDriver is the kubelet's cgroupDriver: the runtime's
	// RuntimeConfig ("" → cgroupfs).
	CgroupDriver string
	// CgroupFS is where the kubelet's cgroup hierarchies are seen from
	// the caller ("" → /sys/fs/cgroup, or /proc/PID/root/sys/fs/cgroup
	// when the kubelet lives in another mount namespace); MountInfo lists
	// them ("" → /proc/self/mountinfo).
	CgroupFS, MountInfo string
	// JoinMountNS, when set (/proc/PID/ns/mnt), runs the kubelet in that
	// mount namespace; else it gets one of its own sharing Dir with the
	// node (see Start).
	JoinMountNS string
	// FeatureGates are the kubelet's featureGates (none: its defaults).
	FeatureGates map[string]bool
	// ExtraConfig is appended to the KubeletConfiguration (YAML, top-level
	// fields), e.g. a tracing block.
	ExtraConfig string
	// Flags are added to the kubelet's command line.
	Flags []string
	// NodePrefix starts the kubelet's node name ("" → "berth-kt-");
	// CgroupPrefix its cgroup root's name ("" → "berthkt"). A random
	// suffix ends both.
	NodePrefix, CgroupPrefix string
	// StartTimeout bounds the wait for the kubelet to serve ("" → 90 s);
	// ClientTimeout each request to it ("" → 30 s).
	StartTimeout, ClientTimeout time.Duration
	// AfterStop, when set, runs in the cleanup once the kubelet has
	// stopped and before its cgroups are removed: the place to remove
	// through CRI the pods it left.
	AfterStop func(k *Kubelet)
}

// BusyNodeConfig is KubeletConfiguration for a test or benchmark node:
// image pulls in parallel (none waits on another), and neither image GC
// nor eviction acting on a busy test disk mid-run. Add it to ExtraConfig.
const BusyNodeConfig = `serializeImagePulls: false
# Neither image GC nor eviction may act on a busy test disk mid-run.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
`

// privateDevicePlugins runs (by sh, in the kubelet's mount namespace)
// before the kubelet: its device manager serves and clears the fixed
// /var/lib/kubelet/device-plugins, which other kubelets on this node use;
// it gets a tmpfs of its own there. The mount holding that path is made
// private first: where it is shared (a systemd host's /, another
// kubelet's root dir) the tmpfs would reach the node's namespace.
const privateDevicePlugins = `set -e
d=/var/lib/kubelet/device-plugins
mkdir -p "$d"
mount --make-private "$(findmnt -n -o TARGET --target "$d")"
mount -t tmpfs -o mode=750 berth-kubelet-test "$d"
exec "$@"`

// Kubelet is one standalone kubelet process (no API server: static pods
// from Manifests), with everything it writes below Opts.Dir.
type Kubelet struct {
	tb                          testing.TB
	Opts                        Options
	RootDir, CertDir, Manifests string
	PodLogs, LogFile            string
	NodeName                    string
	// CgroupRoot is the kubelet's cgroup root as a path below each
	// hierarchy: /berthkt-1a2b3c4d (cgroupfs driver), or the slice
	// /berthkt_1a2b3c4d.slice (systemd driver).
	CgroupRoot string
	// cgroupRootConfig is the kubelet's cgroupRoot setting (cgroupfs
	// form: the kubelet turns /berthkt_1a2b3c4d into its slice itself);
	// slice is the systemd unit made for it ("" with cgroupfs).
	cgroupRootConfig, slice         string
	Port, ReadOnlyPort, HealthzPort int
	// Client talks to the kubelet's ports (its certificate is
	// self-signed: not verified).
	Client *http.Client

	cmd  *exec.Cmd
	done chan struct{}
	argv []string // the whole command line, namespace tools first
}

// Start writes the kubelet's config and starts the kubelet in bin; it
// is stopped, opts.AfterStop run, its pods' processes killed and its
// cgroups and the mounts below Dir removed when tb ends.
func Start(tb testing.TB, bin string, opts Options) *Kubelet {
	tb.Helper()
	opts.setDefaults()
	k := newKubelet(tb, opts, randomSuffix())
	tb.Cleanup(k.cleanup)
	k.makeCgroupRoot()
	configPath := k.writeConfig(tb)
	argv := append([]string{filepath.Join(bin, "kubelet"),
		"--config=" + configPath,
		"--container-runtime-endpoint=" + opts.Endpoint,
		"--root-dir=" + k.RootDir,
		"--cert-dir=" + k.CertDir,
		"--hostname-override=" + k.NodeName,
	}, opts.Flags...)
	argv = append(argv, "--v=2")
	// sh and the tools exec: the pid stays the kubelet's.
	k.argv = append(append(k.mountNamespace(tb), "/bin/sh", "-c", privateDevicePlugins, "kubelet"), argv...)
	k.start(tb)
	return k
}

// setDefaults fills in what the caller left zero.
func (opts *Options) setDefaults() {
	if opts.CgroupFS == "" {
		opts.CgroupFS = cgroupctrl.DefaultRoot
	}
	if opts.CgroupDriver == "" {
		opts.CgroupDriver = "cgroupfs"
	}
	if opts.NodePrefix == "" {
		opts.NodePrefix = "berth-kt-"
	}
	if opts.CgroupPrefix == "" {
		opts.CgroupPrefix = "berthkt"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 90 * time.Second
	}
	if opts.ClientTimeout == 0 {
		opts.ClientTimeout = 30 * time.Second
	}
}

// newKubelet lays a kubelet out below opts.Dir (its directories made),
// its node name and cgroup root ending in suffix.
func newKubelet(tb testing.TB, opts Options, suffix string) *Kubelet {
	tb.Helper()
	ports := FreePorts(tb, 3)
	k := &Kubelet{
		tb:           tb,
		Opts:         opts,
		RootDir:      filepath.Join(opts.Dir, "root"),
		CertDir:      filepath.Join(opts.Dir, "pki"),
		Manifests:    filepath.Join(opts.Dir, "manifests"),
		PodLogs:      filepath.Join(opts.Dir, "pod-logs"),
		LogFile:      filepath.Join(opts.Dir, "kubelet.log"),
		NodeName:     opts.NodePrefix + suffix,
		CgroupRoot:   "/" + opts.CgroupPrefix + "-" + suffix,
		Port:         ports[0],
		ReadOnlyPort: ports[1],
		HealthzPort:  ports[2],
		Client: &http.Client{Timeout: opts.ClientTimeout, Transport: &http.Transport{
			// The kubelet serves a self-signed certificate it made in CertDir.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test client of a self-signed loopback server
		}},
	}
	for _, d := range []string{k.RootDir, k.CertDir, k.Manifests, k.PodLogs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	k.cgroupRootConfig = k.CgroupRoot
	if opts.CgroupDriver == "systemd" {
		// With the systemd driver the root is a slice: the kubelet makes
		// berthkt_<id>-kubepods.slice below it and expects the slice to
		// exist (a plain directory there is no unit systemd knows).
		k.cgroupRootConfig = "/" + opts.CgroupPrefix + "_" + suffix
		k.slice = opts.CgroupPrefix + "_" + suffix + ".slice"
		k.CgroupRoot = "/" + k.slice
	}
	return k
}

// writeConfig writes the kubelet's KubeletConfiguration and returns its
// path.
func (k *Kubelet) writeConfig(tb testing.TB) string {
	tb.Helper()
	opts := k.Opts
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %[1]s
address: 127.0.0.1
port: %[2]d
readOnlyPort: %[3]d
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: %[5]s
cgroupRoot: %[6]s
cgroupsPerQOS: true
failSwapOn: false
# A cgroup v1 host: the kubelet refuses it unless told not to.
failCgroupV1: false
podLogsDir: %[7]s
volumePluginDir: %[8]s
makeIPTablesUtilChains: false
`, k.Manifests, k.Port, k.ReadOnlyPort, k.HealthzPort, opts.CgroupDriver, k.cgroupRootConfig, k.PodLogs,
		filepath.Join(opts.Dir, "volume-plugins"))
	if len(opts.FeatureGates) > 0 {
		gates := make([]string, 0, len(opts.FeatureGates))
		for name, on := range opts.FeatureGates {
			gates = append(gates, fmt.Sprintf("  %s: %v\n", name, on))
		}
		sort.Strings(gates)
		config += "featureGates:\n" + strings.Join(gates, "")
	}
	config += opts.ExtraConfig
	configPath := filepath.Join(opts.Dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	return configPath
}

// mountNamespace returns the command line that runs the kubelet in the
// mount namespace opts.JoinMountNS names or, without it, in one of its
// own but for Dir (made a shared mount of its own first).
func (k *Kubelet) mountNamespace(tb testing.TB) []string {
	tb.Helper()
	dir := k.Opts.Dir
	if k.Opts.JoinMountNS != "" {
		return []string{"nsenter", "--mount=" + k.Opts.JoinMountNS, "--"}
	}
	// A shared mount at Dir makes the kubelet's volume mounts (below its
	// root dir) reach the node's namespace, where the runtime must see
	// them. Dir's bind gets a peer group of its own (private, then
	// shared): on a node whose / is shared (systemd's) a bind of it joins
	// /'s group, so each volume mount would also land on / beneath the
	// bind, and a restarted kubelet, whose / is private, would keep that
	// hidden copy: its rmdir of the volume then fails EBUSY.
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		tb.Fatalf("bind %s: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		tb.Fatalf("make %s private: %v", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		tb.Fatalf("make %s shared: %v", dir, err)
	}
	return []string{"unshare", "--mount", "--propagation", "unchanged", "--"}
}

// start runs the kubelet process (again, after Stop) and waits until it
// serves; its log goes on in LogFile.
func (k *Kubelet) start(tb testing.TB) {
	tb.Helper()
	logFile, err := os.OpenFile(k.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== kubelet starting at %s\n", time.Now().Format(time.RFC3339Nano))
	k.cmd = exec.Command(k.argv[0], k.argv[1:]...)
	k.cmd.Stdout, k.cmd.Stderr = logFile, logFile
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		tb.Fatalf("start kubelet: %v", err)
	}
	done := make(chan struct{})
	k.done = done
	cmd := k.cmd
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	k.waitHealthy(tb)
}

// Restart stops the kubelet and starts it again on the same dirs and
// ports, as an upgrade or a crash would.
func (k *Kubelet) Restart(tb testing.TB) {
	tb.Helper()
	k.Stop()
	k.start(tb)
}

// makeCgroupRoot creates the kubelet's cgroupRoot (the kubelet requires
// it to exist): with the cgroupfs driver a directory in every hierarchy,
// with the cpuset of its parent; with the systemd driver a slice unit,
// with the accounting that makes systemd enable the controllers the
// kubelet checks for in it.
func (k *Kubelet) makeCgroupRoot() {
	if k.slice != "" {
		k.makeSlice()
		return
	}
	// A v2 kubelet wants its controllers in its root's
	// cgroup.controllers: a systemd host enables only those its units
	// asked for.
	k.enableRootControllers()
	for _, dir := range k.CgroupRootDirs() {
		if err := os.Mkdir(dir, 0o755); err != nil {
			k.tb.Fatalf("create the kubelet's cgroup root: %v", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if data, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f)); err == nil {
				_ = os.WriteFile(filepath.Join(dir, f), data, 0o644)
			}
		}
	}
}

// makeSlice starts k.slice, a slice below -.slice known to systemd only
// at runtime (systemctl --runtime; cleanup stops and reverts it). A v2
// kubelet wants cpu, cpuset, memory, hugetlb and pids in the slice's
// cgroup.controllers: the accounting properties and AllowedCPUs make
// systemd enable the first four in the root's subtree_control, and
// hugetlb, which systemd does not manage, is enabled there by hand
// (enableRootControllers) as runc does for its containers.
func (k *Kubelet) makeSlice() {
	systemctl := func(args ...string) {
		out, err := exec.Command("systemctl", args...).CombinedOutput()
		if err != nil {
			k.tb.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	systemctl("set-property", "--runtime", k.slice, "CPUAccounting=yes", "MemoryAccounting=yes",
		"TasksAccounting=yes", fmt.Sprintf("AllowedCPUs=0-%d", runtime.NumCPU()-1))
	systemctl("start", k.slice)
	k.enableRootControllers()
}

// enableRootControllers enables, on cgroup v2, the controllers a
// kubelet wants (cpu, cpuset, memory, hugetlb, pids) in the hierarchy
// root's subtree, those the kernel has.
func (k *Kubelet) enableRootControllers() {
	if !UnifiedCgroups(k.Opts.CgroupFS) {
		return
	}
	ctl := filepath.Join(k.Opts.CgroupFS, "cgroup.subtree_control")
	avail, _ := os.ReadFile(filepath.Join(k.Opts.CgroupFS, "cgroup.controllers"))
	for _, c := range []string{"cpu", "cpuset", "memory", "hugetlb", "pids"} {
		if slices.Contains(strings.Fields(string(avail)), c) {
			if err := os.WriteFile(ctl, []byte("+"+c), 0o644); err != nil {
				k.tb.Fatalf("enable %s below the cgroup root: %v", c, err)
			}
		}
	}
}

// UnifiedCgroups says whether the cgroup filesystem at dir is cgroup v2.
func UnifiedCgroups(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// CgroupRootDirs is the kubelet's cgroup root in every hierarchy.
func (k *Kubelet) CgroupRootDirs() []string {
	hs, err := cgroupctrl.Hierarchies(k.Opts.MountInfo, "")
	if err != nil {
		k.tb.Fatal(err)
	}
	var dirs []string
	for _, h := range hs {
		dirs = append(dirs, filepath.Join(k.Opts.CgroupFS, strings.TrimPrefix(h.Path, cgroupctrl.DefaultRoot), k.CgroupRoot))
	}
	return dirs
}

// QoSCgroups are the cgroups the kubelet keeps below its root while it
// runs (relative to the root): the node allocatable cgroup and the
// besteffort and burstable QoS classes, in the driver's naming.
func (k *Kubelet) QoSCgroups() []string {
	if k.slice == "" {
		return []string{"/kubepods", "/kubepods/besteffort", "/kubepods/burstable"}
	}
	p := strings.TrimSuffix(k.slice, ".slice") + "-kubepods"
	return []string{"/" + p + ".slice", "/" + p + ".slice/" + p + "-besteffort.slice", "/" + p + ".slice/" + p + "-burstable.slice"}
}

// PodCgroup is the cgroup of a pod of QoS class qos (a lower-case
// class below kubepods), relative to the hierarchy's root.
func (k *Kubelet) PodCgroup(qos string, uid string) string {
	if k.slice == "" {
		return k.CgroupRoot + "/kubepods/" + qos + "/pod" + uid
	}
	p := strings.TrimSuffix(k.slice, ".slice") + "-kubepods"
	return k.CgroupRoot + "/" + p + ".slice/" + p + "-" + qos + ".slice/" + p + "-" + qos + "-pod" +
		strings.ReplaceAll(uid, "-", "_") + ".slice"
}

// CgroupDirs lists the cgroups below the kubelet's cgroup root in every
// hierarchy, deepest first.
func (k *Kubelet) CgroupDirs() []string {
	var dirs []string
	for _, r := range k.CgroupRootDirs() {
		_ = filepath.WalkDir(r, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() && p != r {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	return dirs
}

// Pid is the kubelet's process id (0 before it started).
func (k *Kubelet) Pid() int {
	if k.cmd == nil || k.cmd.Process == nil {
		return 0
	}
	return k.cmd.Process.Pid
}

// Stop ends the kubelet (SIGTERM, then SIGKILL after 20 s). Its pods keep
// running, as they do when a kubelet restarts.
func (k *Kubelet) Stop() {
	if k.cmd == nil || k.cmd.Process == nil || k.Exited() {
		return
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(20 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
}

// Exited says whether the kubelet process has ended.
func (k *Kubelet) Exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// cleanup is the backstop when a test failed half-way: the kubelet goes,
// then (AfterStop aside) every process in its pods' cgroups, then those
// cgroups, then the mounts below its dir.
func (k *Kubelet) cleanup() {
	if k.tb.Failed() {
		if dir := os.Getenv("BERTH_KUBELET_LOG_DIR"); dir != "" {
			keep := filepath.Join(dir, k.NodeName+".log")
			if err := os.WriteFile(keep, []byte(k.Log()), 0o644); err == nil {
				k.tb.Logf("kubelet log kept in %s", keep)
			}
		}
		k.tb.Logf("kubelet log (last 400 lines of %s):\n%s", k.LogFile, k.LogTail(400))
	}
	k.Stop()
	if k.Opts.AfterStop != nil {
		k.Opts.AfterStop(k)
	}
	if k.slice != "" {
		// Stopping the slice stops every unit below it (the kubelet's
		// slices, the runtime's scopes); revert drops its runtime properties.
		for _, args := range [][]string{{"stop", k.slice}, {"revert", k.slice}} {
			if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
				k.tb.Errorf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	}
	for _, r := range k.CgroupRootDirs() {
		if _, err := os.Stat(r); err != nil {
			continue
		}
		if err := berthdtest.RemoveCgroupTree(r); err != nil {
			k.tb.Errorf("remove the kubelet's cgroups: %v", err)
		}
	}
	if err := berthdtest.UnmountBelow(k.Opts.Dir); err != nil {
		k.tb.Errorf("unmount below the kubelet's dir: %v", err)
	}
}

// Log is the kubelet's log so far.
func (k *Kubelet) Log() string {
	data, _ := os.ReadFile(k.LogFile)
	return string(data)
}

// LogTail is the end of the kubelet's log.
func (k *Kubelet) LogTail(lines int) string {
	all := strings.Split(k.Log(), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func (k *Kubelet) waitHealthy(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(k.Opts.StartTimeout)
	// Each poll times out: a kubelet that accepts and never answers must
	// not hold the wait past its deadline.
	hc := &http.Client{Timeout: 5 * time.Second}
	for {
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", k.HealthzPort))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if _, err := k.Pods(); err == nil {
					return
				}
			}
			err = fmt.Errorf("healthz %d: %s", resp.StatusCode, body)
		}
		if k.Exited() {
			tb.Fatalf("kubelet exited (%v); log:\n%s", k.cmd.ProcessState, k.LogTail(200))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("kubelet not healthy after %s: %v; log:\n%s", k.Opts.StartTimeout, err, k.LogTail(200))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Apply writes a static pod manifest (atomically: the kubelet ignores
// dot files, so it never reads half of one).
func (k *Kubelet) Apply(tb testing.TB, name, manifest string) {
	tb.Helper()
	tmp := filepath.Join(k.Manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(manifest), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.Manifests, name+".yaml")); err != nil {
		tb.Fatal(err)
	}
}

// Delete removes a static pod manifest: the kubelet tears the pod down.
func (k *Kubelet) Delete(tb testing.TB, name string) {
	tb.Helper()
	if err := os.Remove(filepath.Join(k.Manifests, name+".yaml")); err != nil {
		tb.Fatal(err)
	}
}

// PodName is the name the kubelet gives a static pod: name-<node>.
func (k *Kubelet) PodName(name string) string { return name + "-" + k.NodeName }

// APIURL is path (with query) on the kubelet's authenticated port.
func (k *Kubelet) APIURL(path string, query url.Values) string {
	u := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", k.Port), Path: path, RawQuery: query.Encode()}
	return u.String()
}

// Get fetches url with Client; a status other than 200 is an error.
func (k *Kubelet) Get(url string) ([]byte, error) {
	resp, err := k.Client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body, nil
}

// PodList is the kubelet's /pods on the read-only port: static pods with
// the status the kubelet holds for them, decoded as P (corev1.Pod, or
// the Pod here where k8s.io/api is not at hand).
func PodList[P any](k *Kubelet) ([]P, error) {
	body, err := k.Get(fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort))
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []P `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return list.Items, nil
}

// Pods is PodList with the Pod here.
func (k *Kubelet) Pods() ([]Pod, error) { return PodList[Pod](k) }

// Pod is the part of a pod /pods gives that names it and says whether it
// is Ready.
type Pod struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Status struct {
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// Ready says whether the pod's Ready condition is True.
func (p *Pod) Ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}
