package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// podConfig is a pod named name as the kubelet sends it without
// shareProcessNamespace.
func podConfig(name string) *criapi.PodSandboxConfig {
	return &criapi.PodSandboxConfig{
		Metadata: &criapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: name + "-uid", Attempt: 0},
		Hostname: name,
		Labels:   map[string]string{"app": name},
		// What the kubelet sends without shareProcessNamespace. (The zero
		// value, POD, asks for a shared PID namespace.)
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

// runPod runs cfg and returns the pod's ID.
func runPod(t *testing.T, d *berthdtest.Daemon, cfg *criapi.PodSandboxConfig) string {
	t.Helper()
	resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", cfg.Metadata.Name, err)
	}
	return resp.PodSandboxId
}

// stopRemove stops and removes pod id.
func stopRemove(t *testing.T, d *berthdtest.Daemon, id string) {
	t.Helper()
	if _, err := d.Runtime.StopPodSandbox(berthdtest.Ctx(t), &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if _, err := d.Runtime.RemovePodSandbox(berthdtest.Ctx(t), &criapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
}

// podInfo is PodSandboxStatus's verbose info.
type podInfo struct {
	NetNSPath      string `json:"netnsPath"`
	IPCNSPath      string `json:"ipcnsPath"`
	UTSNSPath      string `json:"utsnsPath"`
	PIDNSPath      string `json:"pidnsPath"`
	CgroupParent   string `json:"cgroupParent"`
	CgroupUnit     string `json:"cgroupUnit"`
	HostnamePath   string `json:"hostnamePath"`
	HostsPath      string `json:"hostsPath"`
	ResolvConfPath string `json:"resolvConfPath"`
	ShmPath        string `json:"shmPath"`
}

// podStatus is pod id's verbose PodSandboxStatus and its info.
func podStatus(t *testing.T, d *berthdtest.Daemon, id string) (*criapi.PodSandboxStatus, podInfo) {
	t.Helper()
	resp, err := d.Runtime.PodSandboxStatus(berthdtest.Ctx(t), &criapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", id, err)
	}
	var info podInfo
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatalf("verbose info %q: %v", resp.Info["info"], err)
	}
	return resp.Status, info
}

// podStats is pod id's PodSandboxStats.
func podStats(t *testing.T, d *berthdtest.Daemon, id string) *criapi.PodSandboxStats {
	t.Helper()
	resp, err := d.Runtime.PodSandboxStats(berthdtest.Ctx(t), &criapi.PodSandboxStatsRequest{PodSandboxId: id})
	if err != nil {
		t.Fatalf("PodSandboxStats %s: %v", id, err)
	}
	return resp.Stats
}

// podMetricsOf returns the metrics of pod (pod level and the container
// ctr's), by name; a metric sent several times (per interface, device,
// failure type) keeps every sample.
func podMetricsOf(t *testing.T, d *berthdtest.Daemon, pod, ctr string) (podLevel, ctrLevel map[string][]*criapi.Metric) {
	t.Helper()
	resp, err := d.Runtime.ListPodSandboxMetrics(berthdtest.Ctx(t), &criapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pm := range resp.PodMetrics {
		if pm.PodSandboxId != pod {
			continue
		}
		podLevel = map[string][]*criapi.Metric{}
		for _, m := range pm.Metrics {
			podLevel[m.Name] = append(podLevel[m.Name], m)
		}
		for _, cm := range pm.ContainerMetrics {
			if cm.ContainerId == ctr {
				ctrLevel = map[string][]*criapi.Metric{}
				for _, m := range cm.Metrics {
					ctrLevel[m.Name] = append(ctrLevel[m.Name], m)
				}
			}
		}
	}
	if podLevel == nil || ctrLevel == nil {
		t.Fatalf("no metrics for pod %s / container %s in %v", pod, ctr, resp.PodMetrics)
	}
	return podLevel, ctrLevel
}

// inNamespace runs fn on an OS thread joined to the namespace pinned at
// path. The thread is never unlocked, so it dies with its goroutine.
func inNamespace(t *testing.T, path string, nstype int, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), nstype); err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// serveInNetns listens on TCP :port inside the pod's network namespace and
// answers every connection with "hello from pod\n".
func serveInNetns(t *testing.T, netns string, port int) {
	t.Helper()
	var ln net.Listener
	err := inNamespace(t, netns, unix.CLONE_NEWNET, func() error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	})
	if err != nil {
		t.Fatalf("listen in pod netns: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from pod\n")
			c.Close()
		}
	}()
}

// dialHello connects to addr and expects serveInNetns's greeting.
func dialHello(addr string) error {
	c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read from %s: %w", addr, err)
	}
	if line != "hello from pod\n" {
		return fmt.Errorf("%s answered %q", addr, line)
	}
	return nil
}

// The mapping critest and a typical kubelet hand out: container 0..99999
// is host 1000..100999.
var usernsMapping = []*criapi.IDMapping{{ContainerId: 0, HostId: 1000, Length: 100000}}

// usernsPodConfig is a pod with its own user namespace, as the kubelet
// sends for hostUsers: false; pid is the pod's PID namespace mode.
func usernsPodConfig(name string, pid criapi.NamespaceMode) *criapi.PodSandboxConfig {
	cfg := podConfig(name)
	cfg.Linux.SecurityContext.NamespaceOptions = &criapi.NamespaceOption{
		Pid:           pid,
		UsernsOptions: &criapi.UserNamespace{Mode: criapi.NamespaceMode_POD, Uids: usernsMapping, Gids: usernsMapping},
	}
	return cfg
}

// startUsernsDaemon starts a daemon whose scratch dir others may search:
// a user namespace's root (host uid 1000) must reach its rootfs and pod
// files below --root and --state, and berthd checks that at start.
func startUsernsDaemon(t *testing.T) *berthdtest.Daemon {
	t.Helper()
	return berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		if err := os.Chmod(filepath.Dir(c.Root), 0o711); err != nil {
			t.Fatal(err)
		}
	}})
}

// newUsernsEnv is a ctrEnv whose pod has a user namespace of its own,
// with pid as its PID namespace mode.
func newUsernsEnv(t *testing.T, pid criapi.NamespaceMode) *ctrEnv {
	t.Helper()
	e := newCtrEnvOn(t, startUsernsDaemon(t))
	stopRemove(t, e.d, e.pod)
	e.podCfg = usernsPodConfig(strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))+"-userns", pid)
	e.podCfg.LogDirectory = e.logDir
	e.pod = runPod(t, e.d, e.podCfg)
	return e
}

// usernsCtrConfig is a container of e's pod restating the pod's user
// namespace options, as the kubelet does.
func (e *ctrEnv) usernsCtrConfig(name string, args ...string) *criapi.ContainerConfig {
	c := e.config(name, args...)
	c.Linux.SecurityContext.NamespaceOptions.UsernsOptions = e.podCfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions
	return c
}
