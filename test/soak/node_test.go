package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/kubelettest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// The registry the pods name and the images the kubelet and the soak's
// own pulls ask for: test/kubelet's (kubelettest).
const (
	registryHost = kubelettest.RegistryHost
	busyboxImage = kubelettest.BusyboxImage
	httpdImage   = kubelettest.HTTPDImage
	// layersImage is pulled (and removed) only by the pull faults: the
	// busybox layer and three of layerMiB incompressible MiB each.
	layersImage = registryHost + "/soak-layers:1.0"
	layerMiB    = 8
)

// kubeletConfig is the node's kubelet beyond kubelettest's basics: a
// full node (maxPods, with room for the churn's overlap), manifests seen within seconds, small log files so
// that long-lived loggers are rotated (ReopenContainerLog) within the
// run, and BusyNodeConfig (parallel pulls, no image GC or eviction acting
// on the small root mid-run).
const kubeletConfig = `podsPerCore: 0
fileCheckFrequency: 5s
containerLogMaxSize: 256Ki
containerLogMaxFiles: 3
` + kubelettest.BusyNodeConfig

// node is the soak's node: registry, berthd on a loop-mounted root, the
// kubelet, and what the faults need.
type node struct {
	t   *testing.T
	p   params
	d   *berthdtest.Daemon
	k   *kubelettest.Kubelet
	reg *testimages.Registry
	// layers is layersImage as pushed; layerDigests its layer blobs.
	layers       v1.Image
	layerDigests []string
	// pushed is every image pushed, by the reference the node uses.
	pushed map[string]v1.Image
	// cniFlag, when it exists, makes the next CNI ADD fail (and go).
	cniFlag string
	// metricsURL is berthd's /metrics (goroutines), read with http.
	metricsURL string
	http       *http.Client
	// scopes are the leak checks' scopes: berthd's (its cgroup parent)
	// and the kubelet's pods' cgroups; before their snapshots with the
	// node up, images pulled, no pod.
	scopes []leakcheck.Scope
	before []leakcheck.Snapshot
}

// cniWrapper is the soak's bridge plugin: the real one, but an ADD fails
// (once: it removes the flag) while the flag file exists.
const cniWrapper = `#!/bin/sh
# berth soak (test/soak): fault injection, a CNI ADD that fails once.
if [ "$CNI_COMMAND" = ADD ] && rm %[1]q 2>/dev/null; then
  printf '{"cniVersion":"1.0.0","code":999,"msg":"soak: injected CNI ADD failure"}\n'
  exit 1
fi
exec %[2]q "$@"
`

func startNode(t *testing.T, p params) *node {
	n := &node{t: t, p: p, pushed: map[string]v1.Image{}, http: &http.Client{Timeout: 5 * time.Second}}
	n.reg = testimages.StartRegistry(t)
	bb, err := testimages.Busybox()
	n.push("busybox:1.36", testimages.Must(t, bb, err))
	httpd, err := testimages.HTTPD()
	n.push("busybox-httpd:1.0", testimages.Must(t, httpd, err))
	n.layers = layersImg(t, p.Seed)
	n.push("soak-layers:1.0", n.layers)
	ls, err := n.layers.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls[1:] {
		h, err := l.Digest()
		if err != nil {
			t.Fatal(err)
		}
		n.layerDigests = append(n.layerDigests, h.String())
	}

	metricsPort := kubelettest.FreePorts(t, 1)[0]
	n.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	var root string
	t.Cleanup(func() {
		if root != "" {
			_ = unix.Unmount(root, unix.MNT_DETACH)
		}
	})
	n.d = berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		dir := filepath.Dir(c.Root)
		root = c.Root
		// A night's debug log of a full node would live in the test's
		// memory (berthdtest keeps it); info is what a node runs with.
		c.LogLevel = "info"
		c.MetricsAddress = fmt.Sprintf("127.0.0.1:%d", metricsPort)
		n.loopRoot(dir, c.Root)
		n.cniFlag = filepath.Join(dir, "cni-fail-next-add")
		n.writeCNI(c, filepath.Join(dir, "cni-bin"))
	}})
	hosts := filepath.Join(n.d.Config.RegistryConfigDir, registryHost)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(fmt.Sprintf(`server = "http://127.0.0.1:1"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, n.reg.Host)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ref := range []string{busyboxImage, httpdImage} {
		if _, err := n.d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
	}

	rc, err := n.d.Runtime.RuntimeConfig(ctx, &criapi.RuntimeConfigRequest{})
	if err != nil {
		t.Fatalf("RuntimeConfig: %v", err)
	}
	driver := "cgroupfs"
	if rc.GetLinux().GetCgroupDriver() == criapi.CgroupDriver_SYSTEMD {
		driver = "systemd"
	}
	n.k = kubelettest.Start(t, kubelettest.BinDir(t, "kubelet"), kubelettest.Options{
		Dir:          filepath.Join(n.d.Dir, "kubelet"),
		Endpoint:     "unix://" + n.d.Socket,
		CgroupDriver: driver,
		// Room for the churn's overlap (a replaced pod's successor may
		// come before it is gone): a full node must not turn pods away.
		ExtraConfig:   fmt.Sprintf("maxPods: %d\n", max(110, p.Pods+p.Churn)) + kubeletConfig,
		Flags:         []string{"--fail-swap-on=false"},
		NodePrefix:    "soak-",
		CgroupPrefix:  "soakkl",
		StartTimeout:  3 * time.Minute,
		ClientTimeout: 60 * time.Second,
		AfterStop:     n.removeLeftPods,
	})

	own := leakcheck.ForDaemon(n.d)
	own.Root = n.d.Root
	pods := own
	pods.CgroupParent = strings.TrimPrefix(n.k.CgroupRoot, "/")
	n.scopes = []leakcheck.Scope{own, pods}
	for _, s := range n.scopes {
		n.before = append(n.before, leakcheck.Take(t, s))
	}
	return n
}

func (n *node) push(repoTag string, img v1.Image) {
	n.reg.Push(n.t, repoTag, img)
	n.pushed[registryHost+"/"+repoTag] = img
}

// layersImg is the busybox base and three layers of layerMiB random
// (incompressible) MiB each, from the soak's seed.
func layersImg(t *testing.T, seed uint64) v1.Image {
	rng := rand.New(rand.NewPCG(seed, 0x1a7e))
	var extra [][]testimages.File
	for i := range 3 {
		data := make([]byte, layerMiB<<20)
		for j := 0; j+8 <= len(data); j += 8 {
			v := rng.Uint64()
			for b := range 8 {
				data[j+b] = byte(v >> (8 * b))
			}
		}
		extra = append(extra, []testimages.File{{Name: fmt.Sprintf("soak-data-%d", i), Data: data}})
	}
	img, err := testimages.Build(extra, v1.Config{Cmd: []string{"sh"}})
	return testimages.Must(t, img, err)
}

// loopRoot makes root a small ext4 filesystem of its own (a sparse file
// in dir, loop-mounted), so that the disk-full fault fills berthd's root
// and nothing else.
func (n *node) loopRoot(dir, root string) {
	img := filepath.Join(dir, "root.img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(int64(n.p.RootMiB) << 20)
		f.Close()
	}
	if err != nil {
		n.t.Fatalf("root image: %v", err)
	}
	// -m 0: no blocks reserved for root (berthd is root: reserved
	// blocks would be free space to it, and the disk never full).
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		n.t.Fatalf("mkfs.ext4 %s: %v\n%s", img, err, out)
	}
	if err := os.MkdirAll(root, 0o711); err != nil {
		n.t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, root).CombinedOutput(); err != nil {
		n.t.Fatalf("mount %s on %s: %v\n%s", img, root, err, out)
	}
	// ext4's lost+found is the filesystem's, not berthd's: gone, so that
	// the leak check's root entries are berthd's alone.
	_ = os.Remove(filepath.Join(root, "lost+found"))
}

// writeCNI puts the embedded default network (same bridge, subnet and
// IPAM dir, so the leak checks' scope holds) in cni_conf_dir with its
// bridge plugin replaced by cniWrapper, and the per-pod masquerade on
// (a real node's conflist has it; it makes iptables rules to leak).
func (n *node) writeCNI(c *config.Config, binDir string) {
	bridge := ""
	for _, d := range c.CNIBinDirs {
		if fi, err := os.Stat(filepath.Join(d, "bridge")); err == nil && !fi.IsDir() {
			bridge = filepath.Join(d, "bridge")
			break
		}
	}
	if bridge == "" {
		n.t.Fatalf("no CNI bridge plugin in %v", c.CNIBinDirs)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "soak-bridge"), []byte(fmt.Sprintf(cniWrapper, n.cniFlag, bridge)), 0o755); err != nil {
		n.t.Fatal(err)
	}
	c.CNIBinDirs = append([]string{binDir}, c.CNIBinDirs...)
	var list map[string]any
	if err := json.Unmarshal(network.DefaultConfList(c.DefaultNetwork.Bridge, c.DefaultNetwork.Subnet, filepath.Join(c.Root, "cni", "networks")), &list); err != nil {
		n.t.Fatal(err)
	}
	// The name stays the embedded network's: host-local keeps its
	// reservations in a directory of that name, as on any berth node.
	plugins, _ := list["plugins"].([]any)
	first, _ := plugins[0].(map[string]any)
	first["type"], first["ipMasq"] = "soak-bridge", true
	data, err := json.Marshal(list)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := os.MkdirAll(c.CNIConfDir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.CNIConfDir, "10-soak.conflist"), data, 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// removeLeftPods removes through CRI what the stopped kubelet left (its
// garbage collection may not have come round): the backstop of a failed
// run, before kubelettest removes its cgroups.
func (n *node) removeLeftPods(*kubelettest.Kubelet) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	list, err := n.d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	for _, s := range list.Items {
		_, _ = n.d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: s.Id})
		if _, err := n.d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			n.t.Errorf("remove pod %s the kubelet left: %v", s.Id, err)
		}
	}
}

// waitServing waits until berthd (just started) answers Version, up to
// bound; berthdtest's WaitReady allows 30 s, too little for a full node
// on a loaded machine, and fails the test where the soak records a miss.
func (n *node) waitServing(bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := n.d.Runtime.Version(ctx, &criapi.VersionRequest{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-n.d.Exited():
			return fmt.Errorf("berthd exited before serving: %v", n.d.ExitErr())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("berthd not serving after %s: %v", bound, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartBerthd starts berthd again (after a kill or a crash point) and
// waits for it to serve.
func (n *node) restartBerthd(env ...string) error {
	n.d.SetEnv(env...)
	n.d.Start()
	return n.waitServing(2 * time.Minute)
}

// shimsServe says whether a monitor runs for the node's pods: any while
// pods are live (after a keeper-kill the orphaned monitor serves its
// pods; a new keeper and monitor come with the next new pod).
func (n *node) shimsServe() bool {
	return len(berthdtest.ShimPids(n.d.State, "monitor")) > 0
}
