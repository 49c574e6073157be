package kubelet

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
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

	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// k8sBins returns the directory holding the Kubernetes programs named,
// built by hack/k8s-bins.sh (once; later calls find them in its cache).
// $BERTH_K8S_BIN_DIR names a directory that already holds them. A build
// that fails fails the test: a kubelet test that cannot get a kubelet
// must not pass by skipping.
func k8sBins(t *testing.T, progs ...string) string {
	t.Helper()
	if dir := os.Getenv("BERTH_K8S_BIN_DIR"); dir != "" {
		for _, p := range progs {
			if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
				t.Fatalf("BERTH_K8S_BIN_DIR=%s: %v", dir, err)
			}
		}
		return dir
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "hack", "k8s-bins.sh")
	start := time.Now()
	var stderr bytes.Buffer
	cmd := exec.Command(script, progs...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/k8s-bins.sh %s: %v\n%s", strings.Join(progs, " "), err, stderr.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("hack/k8s-bins.sh %s took %s", strings.Join(progs, " "), d.Round(time.Second))
	}
	return strings.TrimSpace(string(out))
}

// freePorts returns n distinct TCP ports free on loopback right now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
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

// kubeletOptions say where a kubelet runs and what it talks to.
type kubeletOptions struct {
	// Dir holds the kubelet's root dir, certs, manifests and logs.
	Dir string
	// Socket is the CRI socket (berthd's).
	Socket string
	// CgroupDriver is the kubelet's cgroupDriver: berth's RuntimeConfig.
	CgroupDriver string
	// CgroupFS is where the kubelet's cgroup hierarchies are seen from
	// the test ("/sys/fs/cgroup", or /proc/PID/root/sys/fs/cgroup when the
	// kubelet lives in another mount namespace); MountInfo lists them
	// ("" → /proc/self/mountinfo).
	CgroupFS, MountInfo string
	// JoinMountNS, when set (/proc/PID/ns/mnt), runs the kubelet in that
	// mount namespace; else it gets one of its own sharing Dir with the
	// node (see startKubelet).
	JoinMountNS string
	// FeatureGates are the kubelet's featureGates (none: its defaults).
	FeatureGates map[string]bool
	// ExtraConfig is appended to the KubeletConfiguration (YAML, top-level
	// fields), e.g. a tracing block.
	ExtraConfig string
}

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

// kubelet is one standalone kubelet process (no API server: static pods
// from Manifests), with everything it writes private to this test.
type kubelet struct {
	t                           *testing.T
	opts                        kubeletOptions
	RootDir, CertDir, Manifests string
	PodLogs, LogFile            string
	NodeName                    string
	// CgroupRoot is the kubelet's cgroup root as a path below each
	// hierarchy: /berthkt-1a2b3c4d (cgroupfs driver), or the slice
	// /berthkt_1a2b3c4d.slice (systemd driver).
	CgroupRoot string
	// cgroupRootConfig is the kubelet's cgroupRoot setting (cgroupfs
	// form: the kubelet turns /berthkt_1a2b3c4d into its slice itself);
	// slice is the systemd unit the harness made for it ("" with cgroupfs).
	cgroupRootConfig, slice         string
	Port, ReadOnlyPort, HealthzPort int

	client *http.Client
	cmd    *exec.Cmd
	done   chan struct{}
	argv   []string // the whole command line, namespace tools first
}

// startKubelet writes the kubelet's config and starts it; it is stopped,
// its pods' processes killed and its cgroups removed when the test ends
// (the test's own teardown checks these went by themselves first).
func startKubelet(t *testing.T, bin string, opts kubeletOptions) *kubelet {
	t.Helper()
	if opts.CgroupFS == "" {
		opts.CgroupFS = cgroupctrl.DefaultRoot
	}
	suffix := randomSuffix()
	ports := freePorts(t, 3)
	k := &kubelet{
		t:            t,
		opts:         opts,
		RootDir:      filepath.Join(opts.Dir, "root"),
		CertDir:      filepath.Join(opts.Dir, "pki"),
		Manifests:    filepath.Join(opts.Dir, "manifests"),
		PodLogs:      filepath.Join(opts.Dir, "pod-logs"),
		LogFile:      filepath.Join(opts.Dir, "kubelet.log"),
		NodeName:     "berth-kt-" + suffix,
		CgroupRoot:   "/berthkt-" + suffix,
		Port:         ports[0],
		ReadOnlyPort: ports[1],
		HealthzPort:  ports[2],
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			// The kubelet serves a self-signed certificate it made in CertDir.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test client of a self-signed loopback server
		}},
	}
	for _, d := range []string{k.RootDir, k.CertDir, k.Manifests, k.PodLogs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k.cgroupRootConfig = k.CgroupRoot
	if opts.CgroupDriver == "systemd" {
		// With the systemd driver the root is a slice: the kubelet makes
		// berthkt_<id>-kubepods.slice below it and expects the slice to
		// exist (a plain directory there is no unit systemd knows).
		k.cgroupRootConfig = "/berthkt_" + suffix
		k.slice = "berthkt_" + suffix + ".slice"
		k.CgroupRoot = "/" + k.slice
	}
	t.Cleanup(k.cleanup)
	k.makeCgroupRoot()

	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: %[1]s
fileCheckFrequency: 2s
syncFrequency: 10s
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
failCgroupV1: false
podLogsDir: %[7]s
volumePluginDir: %[8]s
makeIPTablesUtilChains: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
containerLogMaxSize: 1Mi
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
		t.Fatal(err)
	}
	argv := []string{filepath.Join(bin, "kubelet"),
		"--config=" + configPath,
		"--container-runtime-endpoint=unix://" + opts.Socket,
		"--root-dir=" + k.RootDir,
		"--cert-dir=" + k.CertDir,
		"--hostname-override=" + k.NodeName,
		"--fail-swap-on=false",
		"--v=2",
	}
	var prefix []string
	if opts.JoinMountNS != "" {
		prefix = []string{"nsenter", "--mount=" + opts.JoinMountNS, "--"}
	} else {
		// A mount namespace of its own, but for Dir: a shared mount there
		// makes the kubelet's volume mounts (below its root dir) reach
		// the node's namespace, where berthd and runc must see them.
		// Dir's bind gets a peer group of its own (private, then shared):
		// on a node whose / is shared (systemd's) a bind of it joins /'s
		// group, so each volume mount would also land on / beneath the
		// bind, and a restarted kubelet, whose / is private, would keep
		// that hidden copy: its rmdir of the volume then fails EBUSY.
		if err := unix.Mount(opts.Dir, opts.Dir, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind %s: %v", opts.Dir, err)
		}
		if err := unix.Mount("", opts.Dir, "", unix.MS_PRIVATE, ""); err != nil {
			t.Fatalf("make %s private: %v", opts.Dir, err)
		}
		if err := unix.Mount("", opts.Dir, "", unix.MS_SHARED, ""); err != nil {
			t.Fatalf("make %s shared: %v", opts.Dir, err)
		}
		prefix = []string{"unshare", "--mount", "--propagation", "unchanged", "--"}
	}
	// sh and the tools exec: the pid stays the kubelet's.
	k.argv = append(append(prefix, "/bin/sh", "-c", privateDevicePlugins, "kubelet"), argv...)
	k.start(t)
	return k
}

// start runs the kubelet process (again, after Stop) and waits until it
// serves; its log goes on in LogFile.
func (k *kubelet) start(t *testing.T) {
	t.Helper()
	logFile, err := os.OpenFile(k.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== kubelet starting at %s\n", time.Now().Format(time.RFC3339Nano))
	k.cmd = exec.Command(k.argv[0], k.argv[1:]...)
	k.cmd.Stdout, k.cmd.Stderr = logFile, logFile
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("start kubelet: %v", err)
	}
	done := make(chan struct{})
	k.done = done
	cmd := k.cmd
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	k.waitHealthy(t)
}

// Restart stops the kubelet and starts it again on the same dirs and
// ports, as an upgrade or a crash would.
func (k *kubelet) Restart(t *testing.T) {
	t.Helper()
	k.Stop()
	k.start(t)
}

// makeCgroupRoot creates the kubelet's cgroupRoot (the kubelet requires
// it to exist): with the cgroupfs driver a directory in every hierarchy,
// with the cpuset of its parent; with the systemd driver a slice unit,
// with the accounting that makes systemd enable the controllers the
// kubelet checks for in it.
func (k *kubelet) makeCgroupRoot() {
	if k.slice != "" {
		k.makeSlice()
		return
	}
	for _, dir := range k.cgroupRootDirs() {
		if err := os.Mkdir(dir, 0o755); err != nil {
			k.t.Fatalf("create the kubelet's cgroup root: %v", err)
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
// hugetlb, which systemd does not manage, is enabled there by hand as
// runc does for its containers.
func (k *kubelet) makeSlice() {
	systemctl := func(args ...string) {
		out, err := exec.Command("systemctl", args...).CombinedOutput()
		if err != nil {
			k.t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	systemctl("set-property", "--runtime", k.slice, "CPUAccounting=yes", "MemoryAccounting=yes",
		"TasksAccounting=yes", fmt.Sprintf("AllowedCPUs=0-%d", runtime.NumCPU()-1))
	systemctl("start", k.slice)
	if unifiedCgroups(k.opts.CgroupFS) {
		ctl := filepath.Join(k.opts.CgroupFS, "cgroup.subtree_control")
		avail, _ := os.ReadFile(filepath.Join(k.opts.CgroupFS, "cgroup.controllers"))
		for _, c := range []string{"cpu", "cpuset", "memory", "hugetlb", "pids"} {
			if slices.Contains(strings.Fields(string(avail)), c) {
				if err := os.WriteFile(ctl, []byte("+"+c), 0o644); err != nil {
					k.t.Fatalf("enable %s below the cgroup root: %v", c, err)
				}
			}
		}
	}
}

// unifiedCgroups says whether the cgroup filesystem at dir is cgroup v2.
func unifiedCgroups(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgroupRootDirs is the kubelet's cgroup root in every hierarchy.
func (k *kubelet) cgroupRootDirs() []string {
	hs, err := cgroupctrl.Hierarchies(k.opts.MountInfo, "")
	if err != nil {
		k.t.Fatal(err)
	}
	var dirs []string
	for _, h := range hs {
		dirs = append(dirs, filepath.Join(k.opts.CgroupFS, strings.TrimPrefix(h.Path, cgroupctrl.DefaultRoot), k.CgroupRoot))
	}
	return dirs
}

// qosCgroups are the cgroups the kubelet keeps below its root while it
// runs (relative to the root): the node allocatable cgroup and the
// besteffort and burstable QoS classes, in the driver's naming.
func (k *kubelet) qosCgroups() []string {
	if k.slice == "" {
		return []string{"/kubepods", "/kubepods/besteffort", "/kubepods/burstable"}
	}
	p := strings.TrimSuffix(k.slice, ".slice") + "-kubepods"
	return []string{"/" + p + ".slice", "/" + p + ".slice/" + p + "-besteffort.slice", "/" + p + ".slice/" + p + "-burstable.slice"}
}

// podCgroup is the cgroup of a pod of QoS class qos (a lower-case
// class below kubepods), relative to the hierarchy's root.
func (k *kubelet) podCgroup(qos string, uid string) string {
	if k.slice == "" {
		return k.CgroupRoot + "/kubepods/" + qos + "/pod" + uid
	}
	p := strings.TrimSuffix(k.slice, ".slice") + "-kubepods"
	return k.CgroupRoot + "/" + p + ".slice/" + p + "-" + qos + ".slice/" + p + "-" + qos + "-pod" +
		strings.ReplaceAll(uid, "-", "_") + ".slice"
}

// cgroupDirs lists the cgroups below the kubelet's cgroup root in every
// hierarchy, deepest first.
func (k *kubelet) cgroupDirs() []string {
	var dirs []string
	for _, r := range k.cgroupRootDirs() {
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

// Stop ends the kubelet (SIGTERM, then SIGKILL after 20 s). Its pods keep
// running, as they do when a kubelet restarts.
func (k *kubelet) Stop() {
	if k.cmd == nil || k.cmd.Process == nil || k.exited() {
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

// cleanup is the backstop when a test failed half-way: the kubelet goes,
// then every process in its pods' cgroups, then those cgroups.
func (k *kubelet) cleanup() {
	if k.t.Failed() {
		if dir := os.Getenv("BERTH_KUBELET_LOG_DIR"); dir != "" {
			keep := filepath.Join(dir, k.NodeName+".log")
			if err := os.WriteFile(keep, []byte(k.log()), 0o644); err == nil {
				k.t.Logf("kubelet log kept in %s", keep)
			}
		}
		k.t.Logf("kubelet log (last 400 lines of %s):\n%s", k.LogFile, k.logTail(400))
	}
	k.Stop()
	if k.slice != "" {
		// Stopping the slice stops every unit below it (the kubelet's
		// slices, berthd's scopes); revert drops its runtime properties.
		for _, args := range [][]string{{"stop", k.slice}, {"revert", k.slice}} {
			if out, err := exec.Command("systemctl", args...).CombinedOutput(); err != nil {
				k.t.Errorf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	}
	for _, r := range k.cgroupRootDirs() {
		if _, err := os.Stat(r); err != nil {
			continue
		}
		if err := berthdtest.RemoveCgroupTree(r); err != nil {
			k.t.Errorf("remove the kubelet's cgroups: %v", err)
		}
	}
	if err := berthdtest.UnmountBelow(k.opts.Dir); err != nil {
		k.t.Errorf("unmount below the kubelet's dir: %v", err)
	}
}

// log is the kubelet's log so far.
func (k *kubelet) log() string {
	data, _ := os.ReadFile(k.LogFile)
	return string(data)
}

// logTail is the end of the kubelet's log.
func (k *kubelet) logTail(lines int) string {
	data, _ := os.ReadFile(k.LogFile)
	all := strings.Split(string(data), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func (k *kubelet) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

func (k *kubelet) waitHealthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", k.HealthzPort))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if _, err := k.pods(); err == nil {
					return
				}
			}
			err = fmt.Errorf("healthz %d: %s", resp.StatusCode, body)
		}
		if k.exited() {
			t.Fatalf("kubelet exited (%v); log:\n%s", k.cmd.ProcessState, k.logTail(200))
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubelet not healthy after 90s: %v; log:\n%s", err, k.logTail(200))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Apply writes a static pod manifest (atomically: the kubelet ignores
// dot files, so it never reads half of one).
func (k *kubelet) Apply(t *testing.T, name, manifest string) {
	t.Helper()
	tmp := filepath.Join(k.Manifests, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.Manifests, name+".yaml")); err != nil {
		t.Fatal(err)
	}
}

// Delete removes a static pod manifest: the kubelet tears the pod down.
func (k *kubelet) Delete(t *testing.T, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(k.Manifests, name+".yaml")); err != nil {
		t.Fatal(err)
	}
}

// PodName is the name the kubelet gives a static pod: name-<node>.
func (k *kubelet) PodName(name string) string { return name + "-" + k.NodeName }

// pods is the kubelet's /pods on the read-only port: static pods with
// the status the kubelet holds for them.
func (k *kubelet) pods() ([]corev1.Pod, error) {
	resp, err := k.client.Get(fmt.Sprintf("http://127.0.0.1:%d/pods", k.ReadOnlyPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pods: %d %s", resp.StatusCode, body)
	}
	var list corev1.PodList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return list.Items, nil
}

// Pod is the kubelet's view of static pod name, nil if it has none.
func (k *kubelet) Pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pods, err := k.pods()
	if err != nil {
		t.Fatalf("kubelet /pods: %v", err)
	}
	for i := range pods {
		if pods[i].Name == k.PodName(name) {
			return &pods[i]
		}
	}
	return nil
}

// WaitPod polls the kubelet until cond holds for static pod name.
func (k *kubelet) WaitPod(t *testing.T, name, what string, timeout time.Duration, cond func(p *corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *corev1.Pod
	for {
		pods, err := k.pods()
		if err == nil {
			last = nil
			for i := range pods {
				if pods[i].Name == k.PodName(name) {
					last = &pods[i]
				}
			}
			if last != nil && cond(last) {
				return last
			}
		}
		if k.exited() {
			t.Fatalf("kubelet exited while waiting for pod %s: %s", name, what)
		}
		if time.Now().After(deadline) {
			st, _ := json.MarshalIndent(last, "", "  ")
			t.Fatalf("pod %s: not %s after %s (last /pods error: %v); pod:\n%s", name, what, timeout, err, st)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// WaitGone polls until the kubelet no longer lists static pod name.
func (k *kubelet) WaitGone(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for k.Pod(t, name) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still listed %s after its manifest went", name, timeout)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func (k *kubelet) apiURL(path string, query url.Values) string {
	u := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", k.Port), Path: path, RawQuery: query.Encode()}
	return u.String()
}

// Run runs a command in a container through the kubelet's /run (the
// kubelet splits cmd at spaces and calls ExecSync); it returns stdout
// and stderr together.
func (k *kubelet) Run(pod, ctr string, cmd ...string) (string, error) {
	u := k.apiURL(fmt.Sprintf("/run/default/%s/%s", k.PodName(pod), ctr), url.Values{"cmd": {strings.Join(cmd, " ")}})
	resp, err := k.client.Post(u, "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("POST /run %v: %d %s", cmd, resp.StatusCode, body)
	}
	return string(body), nil
}

// MustRun is Run that fails the test on an error.
func (k *kubelet) MustRun(t *testing.T, pod, ctr string, cmd ...string) string {
	t.Helper()
	out, err := k.Run(pod, ctr, cmd...)
	if err != nil {
		t.Fatalf("run %v in %s/%s: %v", cmd, pod, ctr, err)
	}
	return out
}

// Logs reads a container's log through the kubelet's /containerLogs.
func (k *kubelet) Logs(pod, ctr string, query url.Values) (string, error) {
	resp, err := k.client.Get(k.apiURL(fmt.Sprintf("/containerLogs/default/%s/%s", k.PodName(pod), ctr), query))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /containerLogs: %d %s", resp.StatusCode, body)
	}
	return string(body), nil
}

// Exec runs a command through the kubelet's /exec as kubectl exec does:
// a WebSocket (v4.channel.k8s.io) the kubelet proxies to berth's
// streaming server. It returns stdout, stderr and the status message
// (empty for exit 0).
func (k *kubelet) Exec(ctx context.Context, pod, ctr string, cmd ...string) (stdout, stderr, status string, err error) {
	q := url.Values{"command": cmd, "output": {"1"}, "error": {"1"}}
	u := k.apiURL(fmt.Sprintf("/exec/default/%s/%s", k.PodName(pod), ctr), q)
	u = "wss" + strings.TrimPrefix(u, "https")
	dialer := websocket.Dialer{
		TLSClientConfig:  &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed loopback server
		Subprotocols:     []string{"v4.channel.k8s.io"},
		HandshakeTimeout: 20 * time.Second,
	}
	conn, resp, err := dialer.DialContext(ctx, u, nil)
	if err != nil {
		if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			err = fmt.Errorf("%w: %d %s", err, resp.StatusCode, body)
		}
		return "", "", "", err
	}
	defer conn.Close()
	var out, errOut, st bytes.Buffer
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) || errors.Is(err, io.EOF) {
				break
			}
			return out.String(), errOut.String(), st.String(), err
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case 1:
			out.Write(msg[1:])
		case 2:
			errOut.Write(msg[1:])
		case 3:
			st.Write(msg[1:])
		}
	}
	return out.String(), errOut.String(), st.String(), nil
}

// Container status helpers.

func ctrStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func terminated(p *corev1.Pod, name string) *corev1.ContainerStateTerminated {
	if s := ctrStatus(p, name); s != nil {
		return s.State.Terminated
	}
	return nil
}

// mountsByNamespace lists, for every mount namespace on the node, the
// mountinfo lines whose mount point lies under dir, with the processes in
// that namespace: which namespace still holds a volume the kubelet could
// not remove, and with what propagation.
func mountsByNamespace(dir string) string {
	type ns struct {
		pids  []string
		lines []string
	}
	byNS := map[string]*ns{}
	var order []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		id, err := os.Readlink(p + "/ns/mnt")
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(p + "/comm")
		pid := filepath.Base(p) + ":" + strings.TrimSpace(string(comm))
		if n, ok := byNS[id]; ok {
			if len(n.pids) < 8 {
				n.pids = append(n.pids, pid)
			}
			continue
		}
		data, err := os.ReadFile(p + "/mountinfo")
		if err != nil {
			continue
		}
		n := &ns{pids: []string{pid}}
		for _, l := range strings.Split(string(data), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir) {
				n.lines = append(n.lines, l)
			}
		}
		byNS[id] = n
		order = append(order, id)
	}
	var b strings.Builder
	for _, id := range order {
		n := byNS[id]
		if len(n.lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s (%s):\n  %s\n", id, strings.Join(n.pids, " "), strings.Join(n.lines, "\n  "))
	}
	return b.String()
}
