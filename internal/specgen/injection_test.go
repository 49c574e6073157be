package specgen

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestProcessEnvLeavesImageEnvAlone: the image's Env is shared by every
// container made from the image; merging a container's variables must
// never append into its spare capacity or overwrite it, or one
// container's variables show up in the next (CVE-2021-21334).
func TestProcessEnvLeavesImageEnvAlone(t *testing.T) {
	in := testInput(t)
	backing := make([]string, 8)
	for i := range backing {
		backing[i] = fmt.Sprintf("SPARE%d=untouched", i)
	}
	img := backing[:3:8]
	img[0], img[1], img[2] = "PATH=/bin", "SHARED=image", "HOSTNAME=image"
	in.Image.Config.Env = img
	want := slices.Clone(backing)

	var got [2][]string
	for i, secret := range []string{"alice", "bob"} {
		in.Config.Envs = []*runtime.KeyValue{
			{Key: "SECRET", Value: []byte(secret)},
			{Key: "SHARED", Value: []byte(secret)},
			{Key: "ONLY_" + strings.ToUpper(secret), Value: []byte("1")},
		}
		env, err := processEnv(&in)
		if err != nil {
			t.Fatal(err)
		}
		got[i] = env
	}
	if !slices.Equal(backing, want) {
		t.Fatalf("the image's env (with its spare capacity) changed:\n got %q\nwant %q", backing, want)
	}
	for i, other := range []string{"bob", "alice"} {
		for _, kv := range got[i] {
			if strings.Contains(kv, other) || strings.Contains(kv, strings.ToUpper(other)) {
				t.Fatalf("container %d sees the other's variable %q: %q", i, kv, got[i])
			}
		}
	}
	// Appending to one result must not show in the other.
	got[0] = append(got[0], "LATE=1")
	if slices.Contains(got[1], "LATE=1") {
		t.Fatal("the two containers' env share a backing array")
	}
}

// TestBuildConcurrentSameImage: containers of one image are built at
// once (the image's config is one shared value): each spec holds its own
// variables and args only, and the image is not written (go test -race
// reports a write).
func TestBuildConcurrentSameImage(t *testing.T) {
	base := testInput(t)
	env := make([]string, 2, 64)
	env[0], env[1] = "PATH=/bin", "IMG=1"
	base.Image.Config.Env = env
	cmd := make([]string, 1, 64)
	cmd[0] = "sh"
	base.Image.Config.Cmd = cmd
	base.Image.Config.Entrypoint = make([]string, 0, 64)
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := base
			in.ContainerID = fmt.Sprintf("c%d", i)
			cfg := proto.Clone(base.Config).(*runtime.ContainerConfig)
			cfg.Envs = []*runtime.KeyValue{{Key: fmt.Sprintf("MINE%d", i), Value: []byte("1")}}
			cfg.Args = nil
			in.Config = cfg
			s, err := Build(in)
			if err != nil {
				errs[i] = err
				return
			}
			for _, kv := range s.Process.Env {
				if strings.HasPrefix(kv, "MINE") && kv != fmt.Sprintf("MINE%d=1", i) {
					errs[i] = fmt.Errorf("container %d sees %q: %q", i, kv, s.Process.Env)
					return
				}
			}
			if !slices.Equal(s.Process.Args, []string{"sh"}) {
				errs[i] = fmt.Errorf("container %d args %q", i, s.Process.Args)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(env[:cap(env)][:2], []string{"PATH=/bin", "IMG=1"}) || slices.ContainsFunc(env[:cap(env)], func(s string) bool { return strings.HasPrefix(s, "MINE") }) {
		t.Fatalf("image env written: %q", env[:cap(env)])
	}
}

// hostileKeys are annotations and labels that an OCI runtime, systemd or
// containerd's own code act upon: crun's run.oci.* (keep_original_groups,
// seccomp_bpf_data, …), runc's org.systemd.property.* with the systemd
// cgroup driver (CVE-2024-3154: CRI-O passed pod annotations on),
// CRI-O's io.kubernetes.cri-o.* (its own trusted knobs), containerd's
// restart-manager log URI (CVE-2026-53488: image labels copied onto the
// container ran binary://), and berth's own io.kubernetes.cri.* keys,
// which must not be spoofed.
var hostileKeys = map[string]string{
	"org.systemd.property.ExecStopPost":        "['/bin/sh', '-c', 'touch /tmp/pwned-berth-systemd']",
	"org.systemd.property.Delegate":            "yes # pwned-berth-delegate",
	"run.oci.keep_original_groups":             "1 # pwned-berth-groups",
	"run.oci.seccomp_bpf_data":                 "pwned-berth-bpf",
	"run.oci.hooks.stdout":                     "/tmp/pwned-berth-hook",
	"io.kubernetes.cri-o.Devices":              "/dev/sda:/dev/sda:rwm # pwned-berth-devices",
	"io.kubernetes.cri-o.userns-mode":          "host # pwned-berth-userns",
	"io.kubernetes.cri-o.UnifiedCgroup.app":    "memory.max=max # pwned-berth-unified",
	"containerd.io/restart.loguri":             "binary:///bin/sh?args=-c&args=touch+/tmp/pwned-berth-loguri",
	"containerd.io/restart.status":             "running # pwned-berth-status",
	"io.kubernetes.cri.sandbox-id":             "pwned-berth-sandbox",
	"io.kubernetes.cri.container-type":         "sandbox # pwned-berth-type",
	"io.kubernetes.cri.sandbox-namespace":      "kube-system # pwned-berth-ns",
	"io.containerd.runc.v2.group":              "pwned-berth-group",
	"com.docker.hyperv.isolation":              "pwned-berth-docker",
	"io.katacontainers.config.hypervisor.path": "/tmp/pwned-berth-kata",
}

// TestBuildIgnoresInjectedAnnotationsAndLabels: pod and container
// annotations and labels (the CRI client's) and the image's config
// labels (the image author's) never reach the OCI spec: its annotations
// are berth's fixed io.kubernetes.cri.* keys, whatever the inputs, with
// either cgroup driver (CVE-2024-3154, CVE-2026-53488).
func TestBuildIgnoresInjectedAnnotationsAndLabels(t *testing.T) {
	for _, driver := range []string{"cgroupfs", "systemd"} {
		t.Run(driver, func(t *testing.T) {
			in := testInput(t)
			in.CgroupDriver = driver
			if driver == "systemd" {
				in.SandboxConfig.Linux.CgroupParent = "kubepods.slice"
			}
			in.SandboxConfig.Annotations = maps.Clone(hostileKeys)
			in.SandboxConfig.Labels = maps.Clone(hostileKeys)
			in.Config.Annotations = maps.Clone(hostileKeys)
			in.Config.Labels = maps.Clone(hostileKeys)
			in.Image.Config.Labels = maps.Clone(hostileKeys)
			s, err := Build(in)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"io.kubernetes.cri.container-type":    "container",
				"io.kubernetes.cri.sandbox-id":        "p1",
				"io.kubernetes.cri.sandbox-name":      "pod",
				"io.kubernetes.cri.sandbox-namespace": "ns",
				"io.kubernetes.cri.sandbox-uid":       "uid1",
				"io.kubernetes.cri.container-name":    "app",
				"io.kubernetes.cri.image-name":        "docker.io/library/busybox:latest",
			}
			if !maps.Equal(s.Annotations, want) {
				t.Errorf("spec annotations:\n got %q\nwant %q", s.Annotations, want)
			}
			// Nor anywhere else in the spec (hooks, cgroup path, env…).
			js, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range hostileKeys {
				if strings.Contains(string(js), v) || (k != "io.kubernetes.cri.sandbox-id" && k != "io.kubernetes.cri.container-type" &&
					k != "io.kubernetes.cri.sandbox-namespace" && strings.Contains(string(js), k)) {
					t.Errorf("the spec carries %s=%s", k, v)
				}
			}
		})
	}
}
