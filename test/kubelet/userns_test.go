package kubelet

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// hostUsers: false with procMount Unmasked next to the default.
const procMountPod = `apiVersion: v1
kind: Pod
metadata:
  name: userns-procmount
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 2
  containers:
  - name: unmasked
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
    securityContext:
      procMount: Unmasked
  - name: default
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
`

// hostUsers: false on the host's network (KEP-5607).
const usernsHostNetPod = `apiVersion: v1
kind: Pod
metadata:
  name: userns-hostnet
spec:
  hostUsers: false
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
`

// procMounts returns the mounts at or below /proc in a /proc/mounts
// listing, and how many of them are read-only.
func procMounts(mounts string) (lines []string, readonly int) {
	for _, l := range strings.Split(mounts, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || (f[1] != "/proc" && !strings.HasPrefix(f[1], "/proc/")) {
			continue
		}
		lines = append(lines, l)
		if f[3] == "ro" || strings.HasPrefix(f[3], "ro,") {
			readonly++
		}
	}
	return lines, readonly
}

// kubeletUIDMap is a user namespace mapping the kubelet hands out: the
// pod's root is a host ID other than 0, 65536 IDs long.
var kubeletUIDMap = regexp.MustCompile(`^\s*0\s+([1-9][0-9]*)\s+65536\s*$`)

// TestKubeletUserNamespaces runs hostUsers: false static pods through a
// real kubelet with the UserNamespacesHostNetworkSupport gate on: a
// container with procMount: Unmasked sees one read-write /proc (the
// kubelet sends empty masked and read-only lists, which arrive unset)
// while its default neighbour stays masked, as the node e2e ProcMount
// specs check; a hostNetwork pod runs in the host's network namespace
// with the kubelet's mapping. Removing the manifests leaves nothing.
func TestKubeletUserNamespaces(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet")
	e := newEnv(t, bins, envOptions{
		// A user namespace's root must reach its rootfs below --root.
		Berthd: berthdtest.Options{Configure: func(c *config.Config) {
			if err := os.Chmod(filepath.Dir(c.Root), 0o711); err != nil {
				t.Fatal(err)
			}
		}},
		Kubelet: kubeletOptions{FeatureGates: map[string]bool{"UserNamespacesHostNetworkSupport": true}},
	})
	k := e.k
	st, err := e.d.Runtime.Status(context.Background(), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.GetFeatures().GetUserNamespacesHostNetwork() {
		t.Fatalf("berthd reports %+v: user_namespaces_host_network false", st.GetFeatures())
	}
	before := leakcheck.Take(t, e.leakScope())
	vars := map[string]string{"BUSYBOX": busyboxImage}
	pods := map[string]string{"userns-procmount": procMountPod, "userns-hostnet": usernsHostNetPod}
	for name, m := range pods {
		k.Apply(t, name, render(m, vars))
	}
	const podTimeout = 3 * time.Minute
	k.WaitPod(t, "userns-procmount", "Ready", podTimeout, podReady)
	// (Standalone, the kubelet knows no node address: a host network
	// pod reports no IP.)
	k.WaitPod(t, "userns-hostnet", "Ready", podTimeout, podReady)

	t.Run("procMountUnmasked", func(t *testing.T) {
		lines, ro := procMounts(k.MustRun(t, "userns-procmount", "unmasked", "cat", "/proc/mounts"))
		if len(lines) != 1 || ro != 0 {
			t.Errorf("Unmasked: %d read-only of the /proc mounts, want one read-write:\n%s", ro, strings.Join(lines, "\n"))
		}
		lines, ro = procMounts(k.MustRun(t, "userns-procmount", "default", "cat", "/proc/mounts"))
		if len(lines) < 2 || ro == 0 {
			t.Errorf("Default: %d read-only of the /proc mounts, want masked paths and read-only ones:\n%s", ro, strings.Join(lines, "\n"))
		}
		for _, c := range []string{"unmasked", "default"} {
			if m := strings.TrimSpace(k.MustRun(t, "userns-procmount", c, "cat", "/proc/self/uid_map")); !kubeletUIDMap.MatchString(m) {
				t.Errorf("%s: uid_map %q, want the kubelet's mapping", c, m)
			}
		}
	})

	t.Run("hostNetwork", func(t *testing.T) {
		hostNS, err := os.Readlink("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(k.MustRun(t, "userns-hostnet", "main", "readlink", "/proc/self/ns/net")); got != hostNS {
			t.Errorf("container network namespace %s, host's %s", got, hostNS)
		}
		if m := strings.TrimSpace(k.MustRun(t, "userns-hostnet", "main", "cat", "/proc/self/uid_map")); !kubeletUIDMap.MatchString(m) {
			t.Errorf("uid_map %q, want the kubelet's mapping", m)
		}
		// /sys is the host's, read-only.
		var sys int
		for _, l := range strings.Split(k.MustRun(t, "userns-hostnet", "main", "cat", "/proc/mounts"), "\n") {
			if f := strings.Fields(l); len(f) >= 4 && f[1] == "/sys" {
				sys++
				if !strings.HasPrefix(f[3], "ro") {
					t.Errorf("/sys writable: %s", l)
				}
			}
		}
		if sys != 1 {
			t.Errorf("%d /sys mounts", sys)
		}
	})

	t.Run("teardown", func(t *testing.T) {
		for name := range pods {
			k.Delete(t, name)
		}
		for name := range pods {
			k.WaitGone(t, name, 2*time.Minute)
		}
		// The kubelet removes dead containers and sandboxes in its
		// container GC, once a minute.
		waitFor(t, "the kubelet to remove every sandbox and container", 150*time.Second, func() bool {
			sbs, err1 := e.d.Runtime.ListPodSandbox(context.Background(), &criapi.ListPodSandboxRequest{})
			ctrs, err2 := e.d.Runtime.ListContainers(context.Background(), &criapi.ListContainersRequest{})
			return err1 == nil && err2 == nil && len(sbs.Items) == 0 && len(ctrs.Containers) == 0
		})
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
			left, _ := filepath.Glob(filepath.Join(k.RootDir, "pods", "*"))
			left = append(left, e.leaks(before)...)
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("left a minute after the pods went:\n%s", strings.Join(left, "\n"))
			}
		}
	})
}
