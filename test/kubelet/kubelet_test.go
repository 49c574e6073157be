// Package kubelet runs a real kubelet (built from test/k8s by
// hack/k8s-bins.sh) standalone, with static pods, on a private berthd, and
// checks what it reports through its own API: the kubelet, not critest,
// is what drives a CRI runtime in production.
package kubelet

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/kubelettest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// The registry the pods name and the images they use (kubelettest's).
const (
	registryHost = kubelettest.RegistryHost
	busyboxImage = kubelettest.BusyboxImage
	httpdImage   = kubelettest.HTTPDImage
	agnhostImage = registryHost + "/agnhost:2.56"
)

// env is a berthd with the test images behind its registry mirror and a
// kubelet on it.
type env struct {
	t   *testing.T
	d   *berthdtest.Daemon
	k   *kubelet
	reg *testimages.Registry
}

// agnhostImg is busybox plus the real agnhost binary at /agnhost.
func agnhostImg(t *testing.T, bins string) v1.Image {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(bins, "agnhost"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := testimages.Build([][]testimages.File{{{Name: "agnhost", Mode: 0o755, Data: data}}},
		v1.Config{Entrypoint: []string{"/agnhost"}})
	return testimages.Must(t, img, err)
}

// envOptions adjust newEnv.
type envOptions struct {
	Berthd  berthdtest.Options
	Kubelet kubeletOptions
	// Agnhost pushes the agnhost image too (50 MB: only when needed).
	Agnhost bool
	// KubeletInDaemonNS runs the kubelet in berthd's mount namespace
	// (with Berthd.StartProcess putting berthd in one of its own).
	KubeletInDaemonNS bool
}

// newEnv starts the registry, a berthd mirroring registryHost to it and
// a kubelet on that berthd whose cgroup driver is the one berthd reports.
func newEnv(t *testing.T, bins string, opts envOptions) *env {
	t.Helper()
	reg := testimages.StartRegistry(t)
	bb, err := testimages.Busybox()
	reg.Push(t, "busybox:1.36", testimages.Must(t, bb, err))
	httpd, err := testimages.HTTPD()
	reg.Push(t, "busybox-httpd:1.0", testimages.Must(t, httpd, err))
	if opts.Agnhost {
		reg.Push(t, "agnhost:2.56", agnhostImg(t, bins))
	}

	d := berthdtest.Start(t, opts.Berthd)
	hosts := filepath.Join(d.Config.RegistryConfigDir, registryHost)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(fmt.Sprintf(`server = "http://127.0.0.1:1"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, reg.Host)), 0o644); err != nil {
		t.Fatal(err)
	}

	rc, err := d.Runtime.RuntimeConfig(context.Background(), &criapi.RuntimeConfigRequest{})
	if err != nil {
		t.Fatalf("RuntimeConfig: %v", err)
	}
	kopts := opts.Kubelet
	kopts.CgroupDriver = "cgroupfs"
	if rc.GetLinux().GetCgroupDriver() == criapi.CgroupDriver_SYSTEMD {
		kopts.CgroupDriver = "systemd"
	}
	kopts.Dir = filepath.Join(d.Dir, "kubelet")
	kopts.Endpoint = "unix://" + d.Socket
	if opts.KubeletInDaemonNS {
		pid := d.Pid()
		kopts.CgroupFS = fmt.Sprintf("/proc/%d/root/sys/fs/cgroup", pid)
		kopts.MountInfo = fmt.Sprintf("/proc/%d/mountinfo", pid)
		kopts.JoinMountNS = fmt.Sprintf("/proc/%d/ns/mnt", pid)
	}
	k := startKubelet(t, bins, kopts)
	return &env{t: t, d: d, k: k, reg: reg}
}

// leakScope is what the berthd and the kubelet's pods may leave on the
// node: berthd's mounts, files, pod network and processes, and the pod
// cgroups below the kubelet's cgroup root.
func (e *env) leakScope() leakcheck.Scope {
	s := leakcheck.ForDaemon(e.d)
	s.CgroupParent = strings.TrimPrefix(e.k.CgroupRoot, "/")
	return s
}

// leaks lists what the node holds now that it did not at before, but
// for the QoS cgroups the kubelet keeps while it runs (it makes some of
// them only with the first pod) and the kubelet process.
func (e *env) leaks(before leakcheck.Snapshot) []string {
	return e.leaksIn(e.leakScope(), before)
}

// leaksIn is leaks for a scope of the test's own (one with berthd's
// root, say), before taken of it.
func (e *env) leaksIn(scope leakcheck.Scope, before leakcheck.Snapshot) []string {
	var out []string
	for _, l := range leakcheck.Diff(before, leakcheck.Take(e.t, scope)) {
		qos := false
		for _, c := range e.k.QoSCgroups() {
			qos = qos || strings.HasSuffix(l, e.k.CgroupRoot+c)
		}
		// The kubelet itself names the daemon's dir (its own lives there)
		// and has a new pid after a restart.
		self := e.k.Pid() != 0 && strings.HasPrefix(l, fmt.Sprintf("process: %d ", e.k.Pid()))
		if (!strings.HasPrefix(l, "cgroup: ") || !qos) && !self {
			out = append(out, l)
		}
	}
	return out
}

// newItems lists the items of after that before lacks.
func newItems(before, after []string) []string {
	var out []string
	for _, a := range after {
		if !slices.Contains(before, a) {
			out = append(out, a)
		}
	}
	return out
}

// render fills {{NAME}} placeholders of a manifest.
func render(manifest string, vars map[string]string) string {
	var pairs []string
	for k, v := range vars {
		pairs = append(pairs, "{{"+k+"}}", v)
	}
	return strings.NewReplacer(pairs...).Replace(manifest)
}

// Pods running on: probes of every kind and a hostPort. Every probe has
// a 10 s timeout (the default is 1 s): under a TCG guest an exec takes
// seconds, and a liveness probe timing out restarts the container.
const probesPod = `apiVersion: v1
kind: Pod
metadata:
  name: probes
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: web
    image: {{HTTPD}}
    ports:
    - containerPort: 80
      hostPort: {{HOSTPORT}}
    readinessProbe:
      httpGet: {path: /, port: 80}
      periodSeconds: 1
      timeoutSeconds: 10
    livenessProbe:
      exec: {command: [cat, /www/index.html]}
      periodSeconds: 2
      timeoutSeconds: 10
      failureThreshold: 5
  - name: tcp
    image: {{BUSYBOX}}
    command: [nc, -ll, -p, "8081", -e, /bin/true]
    readinessProbe:
      tcpSocket: {port: 8081}
      periodSeconds: 1
      timeoutSeconds: 10
    livenessProbe:
      tcpSocket: {port: 8081}
      periodSeconds: 2
      timeoutSeconds: 10
      failureThreshold: 5
  - name: grpc
    image: {{AGNHOST}}
    args: [grpc-health-checking, --port=5000, --http-port=8082]
    readinessProbe:
      grpc: {port: 5000}
      periodSeconds: 1
      timeoutSeconds: 10
    livenessProbe:
      grpc: {port: 5000}
      periodSeconds: 2
      timeoutSeconds: 10
      failureThreshold: 30
`

// Init and sidecar containers, hooks, volumes, downward API, limits.
// The grace period bounds the preStop hook, an exec in a container held
// to 250m of CPU: in the TCG guest under load one exec took 4-6 s and a
// 5 s grace killed the hook (137) before it wrote. main traps TERM and
// exits at once, so a longer grace costs nothing when the hook is quick.
const lifecyclePod = `apiVersion: v1
kind: Pod
metadata:
  name: lifecycle
spec:
  terminationGracePeriodSeconds: 30
  volumes:
  - name: work
    emptyDir: {}
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 16Mi}
  - name: host
    hostPath: {path: {{HOSTPATH}}, type: Directory}
  initContainers:
  - name: init
    image: {{BUSYBOX}}
    command: [sh, -c, "echo init-ran > /work/init"]
    volumeMounts: [{name: work, mountPath: /work}]
  - name: sidecar
    image: {{BUSYBOX}}
    restartPolicy: Always
    command: [sh, -c, "echo sidecar-up > /work/sidecar; trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: main
    image: {{BUSYBOX}}
    command: [sh, -c, "trap 'exit 0' TERM; echo hello from main; i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"]
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: POD_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - name: NODE_NAME
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    - name: MEM_LIMIT
      valueFrom: {resourceFieldRef: {containerName: main, resource: limits.memory}}
    - name: CPU_REQUEST_MILLI
      valueFrom: {resourceFieldRef: {containerName: main, resource: requests.cpu, divisor: 1m}}
    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {cpu: 250m, memory: 64Mi}
    lifecycle:
      postStart:
        exec: {command: [sh, -c, "echo poststart > /work/poststart"]}
      preStop:
        exec: {command: [sh, -c, "echo prestop > /host/prestop"]}
    readinessProbe:
      exec: {command: [cat, /work/poststart]}
      periodSeconds: 1
      timeoutSeconds: 10
    volumeMounts:
    - {name: work, mountPath: /work}
    - {name: mem, mountPath: /mem}
    - {name: host, mountPath: /host}
`

// Containers that end: termination messages and the OOM killer.
const exitsPod = `apiVersion: v1
kind: Pod
metadata:
  name: exits
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 3
  containers:
  - name: msgfile
    image: {{BUSYBOX}}
    command: [sh, -c, "printf bye-from-file > /dev/termination-log"]
  - name: fallback
    image: {{BUSYBOX}}
    terminationMessagePolicy: FallbackToLogsOnError
    command: [sh, -c, "echo -n DONE; false"]
  - name: oom
    image: {{BUSYBOX}}
    command: [dd, if=/dev/zero, of=/dev/null, bs=256M, count=1]
    resources:
      limits: {memory: 32Mi}
`

// A crash loop, and a container that never gets ready.
const crashPod = `apiVersion: v1
kind: Pod
metadata:
  name: crash
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: crash
    image: {{BUSYBOX}}
    command: [sh, -c, "echo crashing; exit 3"]
  - name: notready
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
    readinessProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      timeoutSeconds: 10
`

// TestKubeletStaticPodsOnBerth runs static pods through a real kubelet on
// berth, checks each feature through the kubelet's API, kills berthd with
// SIGKILL and restarts it under the running pods, then removes the
// manifests and checks that nothing is left.
func TestKubeletStaticPodsOnBerth(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet", "agnhost")
	e := newEnv(t, bins, envOptions{Agnhost: true})
	k := e.k
	scope := e.leakScope()
	before := leakcheck.Take(t, scope)
	mountsBefore, err := berthdtest.MountsBelow(k.Opts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(k.Opts.Dir, "hostpath")
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		t.Fatal(err)
	}
	hostPort := kubelettest.FreePorts(t, 1)[0]
	vars := map[string]string{
		"BUSYBOX": busyboxImage, "HTTPD": httpdImage, "AGNHOST": agnhostImage,
		"HOSTPORT": strconv.Itoa(hostPort), "HOSTPATH": hostDir,
	}
	pods := map[string]string{"probes": probesPod, "lifecycle": lifecyclePod, "exits": exitsPod, "crash": crashPod}
	for name, m := range pods {
		k.Apply(t, name, render(m, vars))
	}

	// A bound for a pod that never becomes Ready, not a speed: in the
	// cgroup v2 guest's TCG beside a CPU-bound job the probes pod was still
	// pulling and unpacking its images (agnhost among them) after 3 minutes.
	const podTimeout = 10 * time.Minute
	probes := k.WaitPod(t, "probes", "Ready", podTimeout, podReady)
	lifecycle := k.WaitPod(t, "lifecycle", "Ready", podTimeout, podReady)

	t.Run("probes", func(t *testing.T) {
		for _, c := range []string{"web", "tcp", "grpc"} {
			if s := ctrStatus(probes, c); s == nil || !s.Ready || s.State.Running == nil {
				t.Fatalf("container %s: %+v", c, s)
			}
		}
		// The gRPC probe follows the server: agnhost reports NOT_SERVING
		// after /make-not-serving on its HTTP port.
		toggle := func(path string) {
			resp, err := http.Get(fmt.Sprintf("http://%s/%s", net.JoinHostPort(probes.Status.PodIP, "8082"), path))
			if err != nil {
				t.Fatalf("agnhost %s: %v", path, err)
			}
			resp.Body.Close()
		}
		toggle("make-not-serving")
		k.WaitPod(t, "probes", "unready after the gRPC server stops serving", time.Minute, func(p *corev1.Pod) bool {
			s := ctrStatus(p, "grpc")
			return s != nil && !s.Ready && !podReady(p)
		})
		toggle("make-serving")
		probes = k.WaitPod(t, "probes", "Ready again", time.Minute, podReady)
		if s := ctrStatus(probes, "grpc"); s.RestartCount != 0 {
			t.Fatalf("grpc container restarted %d times", s.RestartCount)
		}
	})

	t.Run("hostPort", func(t *testing.T) {
		gw, _, err := net.ParseCIDR(e.d.Config.DefaultNetwork.Subnet)
		if err != nil {
			t.Fatal(err)
		}
		gw = gw.To4()
		gw[3] = 1
		body := httpGet(t, fmt.Sprintf("http://%s/", net.JoinHostPort(gw.String(), strconv.Itoa(hostPort))))
		if body != testimages.HTTPDIndex {
			t.Fatalf("hostPort %d answered %q", hostPort, body)
		}
	})

	t.Run("initAndSidecar", func(t *testing.T) {
		if s := ctrStatus(lifecycle, "init"); s == nil || s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			t.Fatalf("init container: %+v", s)
		}
		if s := ctrStatus(lifecycle, "sidecar"); s == nil || s.State.Running == nil || s.Started == nil || !*s.Started {
			t.Fatalf("sidecar container: %+v", s)
		}
		for file, want := range map[string]string{"/work/init": "init-ran", "/work/sidecar": "sidecar-up"} {
			if got := strings.TrimSpace(k.MustRun(t, "lifecycle", "main", "cat", file)); got != want {
				t.Fatalf("%s = %q, want %q", file, got, want)
			}
		}
	})

	t.Run("postStart", func(t *testing.T) {
		if got := strings.TrimSpace(k.MustRun(t, "lifecycle", "main", "cat", "/work/poststart")); got != "poststart" {
			t.Fatalf("postStart hook wrote %q", got)
		}
	})

	t.Run("downwardAPIEnv", func(t *testing.T) {
		out := k.MustRun(t, "lifecycle", "main", "env")
		for _, want := range []string{
			"POD_NAME=" + k.PodName("lifecycle"), "POD_NAMESPACE=default", "NODE_NAME=" + k.NodeName,
			"POD_IP=" + lifecycle.Status.PodIP, "MEM_LIMIT=67108864", "CPU_REQUEST_MILLI=100",
		} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("env lacks %s:\n%s", want, out)
			}
		}
	})

	t.Run("volumes", func(t *testing.T) {
		mounts := k.MustRun(t, "lifecycle", "main", "cat", "/proc/mounts")
		fsType := map[string]string{}
		for _, l := range strings.Split(mounts, "\n") {
			if f := strings.Fields(l); len(f) >= 3 {
				fsType[f[1]] = f[2]
			}
		}
		if fsType["/mem"] != "tmpfs" || fsType["/work"] == "" || fsType["/work"] == "tmpfs" || fsType["/host"] == "" {
			t.Fatalf("emptyDir Memory on /mem, disk on /work, hostPath on /host: %v", fsType)
		}
		k.MustRun(t, "lifecycle", "main", "touch", "/host/from-container")
		if _, err := os.Stat(filepath.Join(hostDir, "from-container")); err != nil {
			t.Fatalf("hostPath write not seen on the host: %v", err)
		}
	})

	t.Run("cgroupLimits", func(t *testing.T) {
		// The container sees its own cgroup at /sys/fs/cgroup: v1's
		// per-controller files, or v2's (cgroup namespace) unified ones;
		// shares 102 is v2's cpu.weight 4.
		limits := map[string]string{
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "67108864",
			"/sys/fs/cgroup/cpu/cpu.cfs_quota_us":         "25000",
			"/sys/fs/cgroup/cpu/cpu.cfs_period_us":        "100000",
			"/sys/fs/cgroup/cpu/cpu.shares":               "102",
		}
		v2 := kubelettest.UnifiedCgroups(k.Opts.CgroupFS)
		if v2 {
			limits = map[string]string{
				"/sys/fs/cgroup/memory.max": "67108864",
				"/sys/fs/cgroup/cpu.max":    "25000 100000",
				"/sys/fs/cgroup/cpu.weight": "4",
			}
		}
		for file, want := range limits {
			if got := strings.TrimSpace(k.MustRun(t, "lifecycle", "main", "cat", file)); got != want {
				t.Errorf("%s = %q, want %s", file, got, want)
			}
		}
		// The container's cgroup is the kubelet's: below its cgroup root,
		// in the burstable QoS class, in the pod's cgroup. On v1 the
		// container's /proc/self/cgroup names it; on v2 its cgroup
		// namespace hides it, and the host's view of its processes does.
		want := k.PodCgroup("burstable", string(lifecycle.UID)) + "/"
		if !v2 {
			cg := k.MustRun(t, "lifecycle", "main", "cat", "/proc/self/cgroup")
			if !strings.Contains(cg, ":memory:"+want) {
				t.Errorf("container cgroups lack :memory:%s:\n%s", want, cg)
			}
			return
		}
		if n := processesInCgroup("0::" + want); n == 0 {
			t.Errorf("no process in a cgroup below %s", want)
		}
	})

	t.Run("logs", func(t *testing.T) {
		var logs string
		waitFor(t, "main's log to show ticks", 30*time.Second, func() bool {
			var err error
			logs, err = k.Logs("lifecycle", "main", nil)
			return err == nil && strings.Contains(logs, "tick 2\n")
		})
		if !strings.HasPrefix(logs, "hello from main\ntick 0\n") {
			t.Fatalf("main's log:\n%s", logs)
		}
		tail, err := k.Logs("lifecycle", "main", url.Values{"tailLines": {"1"}})
		if err != nil || strings.Count(tail, "\n") != 1 || !strings.HasPrefix(tail, "tick ") {
			t.Fatalf("tailLines=1: %q, %v", tail, err)
		}
	})

	t.Run("exec", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stdout, stderr, st, err := k.Exec(ctx, "lifecycle", "main", "sh", "-c", "echo out; echo err >&2; exit 3")
		if err != nil || stdout != "out\n" || stderr != "err\n" || !strings.Contains(st, "exit code 3") {
			t.Fatalf("exec: stdout %q stderr %q status %s err %v", stdout, stderr, st, err)
		}
		stdout, _, st, err = k.Exec(ctx, "probes", "web", "cat", "/www/index.html")
		if err != nil || stdout != testimages.HTTPDIndex || !strings.Contains(st, `"Success"`) {
			t.Fatalf("exec: stdout %q status %s err %v", stdout, st, err)
		}
	})

	t.Run("terminationMessages", func(t *testing.T) {
		p := k.WaitPod(t, "exits", "done", podTimeout, func(p *corev1.Pod) bool {
			return terminated(p, "msgfile") != nil && terminated(p, "fallback") != nil && terminated(p, "oom") != nil
		})
		if s := terminated(p, "msgfile"); s.ExitCode != 0 || s.Message != "bye-from-file" {
			t.Errorf("msgfile: exit %d message %q", s.ExitCode, s.Message)
		}
		// FallbackToLogsOnError takes the log's tail as written: the
		// final line without a newline stays without one.
		if s := terminated(p, "fallback"); s.ExitCode != 1 || s.Message != "DONE" {
			t.Errorf("fallback: exit %d message %q, want exit 1 message \"DONE\"", s.ExitCode, s.Message)
		}
		if p.Status.Phase != corev1.PodFailed {
			t.Errorf("pod phase %s, want Failed", p.Status.Phase)
		}
	})

	t.Run("oomKilled", func(t *testing.T) {
		p := k.WaitPod(t, "exits", "done", podTimeout, func(p *corev1.Pod) bool { return terminated(p, "oom") != nil })
		if s := terminated(p, "oom"); s.Reason != "OOMKilled" || s.ExitCode != 137 {
			t.Fatalf("oom: reason %q exit %d, want OOMKilled 137", s.Reason, s.ExitCode)
		}
	})

	t.Run("crashLoop", func(t *testing.T) {
		p := k.WaitPod(t, "crash", "crash-looping", podTimeout, func(p *corev1.Pod) bool {
			s := ctrStatus(p, "crash")
			return s != nil && s.RestartCount >= 2 && s.State.Waiting != nil && s.State.Waiting.Reason == "CrashLoopBackOff"
		})
		s := ctrStatus(p, "crash")
		if last := s.LastTerminationState.Terminated; last == nil || last.ExitCode != 3 {
			t.Fatalf("crash: last termination %+v, want exit 3", last)
		}
		prev, err := k.Logs("crash", "crash", url.Values{"previous": {"true"}})
		if err != nil || prev != "crashing\n" {
			t.Fatalf("previous log %q, %v", prev, err)
		}
		if s := ctrStatus(p, "notready"); s == nil || s.Ready || s.State.Running == nil || podReady(p) {
			t.Fatalf("notready: %+v (a failing exec readiness probe must keep it unready)", s)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("berthdKilledAndRestarted", func(t *testing.T) {
		running := map[string]map[string]ctrInstance{}
		for _, name := range []string{"probes", "lifecycle"} {
			running[name] = instances(k.WaitPod(t, name, "Ready", time.Minute, podReady))
		}
		exitsBefore := k.Pod(t, "exits").Status.ContainerStatuses
		logBefore, err := k.Logs("lifecycle", "main", nil)
		if err != nil {
			t.Fatal(err)
		}

		logMark := len(k.Log())
		e.d.Kill()
		// The kubelet checks the runtime every 5 s: wait until it has
		// found it gone (it then skips pod syncs), so the restart is one it
		// lives through rather than one it never saw.
		waitFor(t, "the kubelet to find the runtime down", time.Minute, func() bool {
			l := k.Log()[logMark:]
			return strings.Contains(l, "Container runtime sanity check failed") || strings.Contains(l, "Skipping pod synchronization")
		})
		if _, err := k.Run("lifecycle", "main", "true"); err == nil {
			t.Fatal("exec worked with berthd down")
		}
		e.d.Start()
		e.d.WaitReady()
		// Its CRI connection comes back after gRPC's reconnect back-off.
		waitFor(t, "exec through the kubelet to work again", time.Minute, func() bool {
			out, err := k.Run("lifecycle", "main", "cat", "/work/poststart")
			return err == nil && strings.TrimSpace(out) == "poststart"
		})
		for name, want := range running {
			p := k.WaitPod(t, name, "Ready after berthd's restart", 2*time.Minute, podReady)
			if got := instances(p); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("pod %s containers changed across berthd's restart:\n got %v\nwant %v", name, got, want)
			}
		}
		if got := k.Pod(t, "exits").Status.ContainerStatuses; fmt.Sprint(statusSummary(got)) != fmt.Sprint(statusSummary(exitsBefore)) {
			t.Errorf("terminated containers changed across the restart:\n got %v\nwant %v", statusSummary(got), statusSummary(exitsBefore))
		}
		// The containers kept running and logging through the restart.
		waitFor(t, "main's log to grow after the restart", 30*time.Second, func() bool {
			logs, err := k.Logs("lifecycle", "main", nil)
			return err == nil && strings.HasPrefix(logs, logBefore) && strings.Count(logs, "\n") > strings.Count(logBefore, "\n")+3
		})
	})
	if t.Failed() {
		return
	}

	t.Run("kubeletRestarted", func(t *testing.T) {
		// A kubelet restarting (an upgrade, a crash) finds its pods in
		// berth and adopts them: nothing is created or restarted again.
		running := map[string]map[string]ctrInstance{}
		for _, name := range []string{"probes", "lifecycle"} {
			running[name] = instances(k.WaitPod(t, name, "Ready", time.Minute, podReady))
		}
		exitsBefore := statusSummary(k.Pod(t, "exits").Status.ContainerStatuses)
		k.Restart(t)
		t.Logf("mounts under the kubelet's pods dir after its restart, by mount namespace:\n%s", mountsByNamespace(filepath.Join(k.RootDir, "pods")))
		for name, want := range running {
			p := k.WaitPod(t, name, "Ready after the kubelet's restart", 2*time.Minute, podReady)
			if got := instances(p); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("pod %s containers changed across the kubelet's restart:\n got %v\nwant %v", name, got, want)
			}
		}
		// Terminated containers as the new kubelet reads them from berth.
		p := k.WaitPod(t, "exits", "reported", time.Minute, func(p *corev1.Pod) bool { return len(p.Status.ContainerStatuses) == 3 })
		if got := statusSummary(p.Status.ContainerStatuses); fmt.Sprint(got) != fmt.Sprint(exitsBefore) {
			t.Errorf("terminated containers as the restarted kubelet sees them:\n got %v\nwant %v", got, exitsBefore)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("teardown", func(t *testing.T) {
		t.Logf("mounts under the kubelet's pods dir before teardown, by mount namespace:\n%s", mountsByNamespace(filepath.Join(k.RootDir, "pods")))
		for name := range pods {
			k.Delete(t, name)
		}
		for name := range pods {
			k.WaitGone(t, name, 2*time.Minute)
		}
		// A static pod leaves /pods as soon as its manifest goes; the
		// kubelet then runs the preStop hook and stops the containers.
		waitFor(t, "the preStop hook to write to the hostPath", time.Minute, func() bool {
			data, err := os.ReadFile(filepath.Join(hostDir, "prestop"))
			return err == nil && strings.TrimSpace(string(data)) == "prestop"
		})
		// The kubelet removes the dead containers and sandboxes of deleted
		// pods in its container GC, once a minute.
		waitFor(t, "the kubelet to remove every sandbox and container", 150*time.Second, func() bool {
			sbs, err1 := e.d.Runtime.ListPodSandbox(context.Background(), &criapi.ListPodSandboxRequest{})
			ctrs, err2 := e.d.Runtime.ListContainers(context.Background(), &criapi.ListContainersRequest{})
			return err1 == nil && err2 == nil && len(sbs.Items) == 0 && len(ctrs.Containers) == 0
		})
		var left []string
		deadline := time.Now().Add(time.Minute)
		for {
			left = left[:0]
			podDirs, _ := filepath.Glob(filepath.Join(k.RootDir, "pods", "*"))
			logDirs, _ := filepath.Glob(filepath.Join(k.PodLogs, "*"))
			mounts, _ := berthdtest.MountsBelow(k.Opts.Dir)
			left = append(append(append(left, podDirs...), logDirs...), newItems(mountsBefore, mounts)...)
			left = append(left, e.leaks(before)...)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Logf("mounts under the kubelet's pods dir, by mount namespace:\n%s", mountsByNamespace(filepath.Join(k.RootDir, "pods")))
				t.Fatalf("left a minute after the pods went:\n%s", strings.Join(left, "\n"))
			}
			time.Sleep(300 * time.Millisecond)
		}
		links, _ := filepath.Glob("/var/log/containers/*" + k.NodeName + "*")
		if len(links) > 0 {
			t.Errorf("container log links left: %v", links)
		}
	})
}

// processesInCgroup counts the host's processes with a line of
// /proc/PID/cgroup starting with prefix.
func processesInCgroup(prefix string) int {
	n := 0
	files, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, prefix) {
				n++
				break
			}
		}
	}
	return n
}

// ctrInstance is one run of a container: the same ID and restart count
// mean nothing restarted or re-created it.
type ctrInstance struct {
	id       string
	restarts int32
}

// instances maps a pod's containers (init ones too) to their instance.
func instances(p *corev1.Pod) map[string]ctrInstance {
	m := map[string]ctrInstance{}
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for _, s := range list {
			m[s.Name] = ctrInstance{s.ContainerID, s.RestartCount}
		}
	}
	return m
}

type exitSummary struct {
	Name, Reason, Message string
	Code                  int32
}

func statusSummary(list []corev1.ContainerStatus) []exitSummary {
	var out []exitSummary
	for _, s := range list {
		es := exitSummary{Name: s.Name}
		if s.State.Terminated != nil {
			es.Reason, es.Message, es.Code = s.State.Terminated.Reason, s.State.Terminated.Message, s.State.Terminated.ExitCode
		}
		out = append(out, es)
	}
	return out
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	var body string
	waitFor(t, "GET "+u, 30*time.Second, func() bool {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(u)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		body = string(data)
		return err == nil && resp.StatusCode == http.StatusOK
	})
	return body
}

// waitFor polls cond every 300 ms until it holds or timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
