package security

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/cditest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// hostileRestoreEnv is a berthd with CDI configured (the fake device of
// cditest, whose injection adds a device node, env, a host bind mount and
// a hook), busybox and another image pulled, and one pod.
type hostileRestoreEnv struct {
	t       *testing.T
	d       *berthdtest.Daemon
	reg     *testimages.Registry
	pod     string
	podCfg  *criapi.PodSandboxConfig
	busybox string // image ID
	other   string // image ID of another image in the store
	dataDir string // the request's host directory, mounted at /data
	hookLog string // the CDI hook's log: must stay empty
	scratch string
}

func newHostileRestoreEnv(t *testing.T) *hostileRestoreEnv {
	t.Helper()
	berthdtest.RequireCRIU(t)
	scratch := t.TempDir()
	specDir := filepath.Join(scratch, "cdi")
	info, hookLog := filepath.Join(scratch, "info"), filepath.Join(scratch, "hook.log")
	dataDir := filepath.Join(scratch, "data")
	for _, dir := range []string{specDir, dataDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(info, []byte("fake-device-info\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(specDir, "fake.json"), []byte(cditest.FakeSpec(info, hookLog)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.CDISpecDirs = []string{specDir}
	}})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	e := &hostileRestoreEnv{t: t, d: d, reg: reg, dataDir: dataDir, hookLog: hookLog, scratch: scratch}
	e.busybox = e.pull(reg.Ref("busybox:latest"))
	e.other = e.pull(reg.Ref(testimages.HTTPDRef))
	e.podCfg = &criapi.PodSandboxConfig{
		Metadata: &criapi.PodSandboxMetadata{Name: "hostile-restore", Namespace: "security", Uid: "hostile-restore-uid"},
		Hostname: "hostile",
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
	resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: e.podCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	e.pod = resp.PodSandboxId
	return e
}

func (e *hostileRestoreEnv) pull(ref string) string {
	e.t.Helper()
	if _, err := e.d.Image.PullImage(berthdtest.Ctx(e.t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		e.t.Fatalf("pull %s: %v", ref, err)
	}
	st, err := e.d.Image.ImageStatus(berthdtest.Ctx(e.t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: ref}})
	if err != nil || st.Image == nil {
		e.t.Fatalf("ImageStatus %s: %v", ref, err)
	}
	return st.Image.Id
}

// config is what the kubelet asks for: busybox sleeping, the pod's host
// directory at /data (a hostPath the kubelet allowed), one annotation of
// its own.
func (e *hostileRestoreEnv) config(name string) *criapi.ContainerConfig {
	return &criapi.ContainerConfig{
		Metadata:    &criapi.ContainerMetadata{Name: name},
		Image:       &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")},
		Command:     []string{"sleep", "3600"},
		Annotations: map[string]string{"io.berth.test/request": "yes"},
		Mounts:      []*criapi.Mount{{ContainerPath: "/data", HostPath: e.dataDir}},
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

func (e *hostileRestoreEnv) create(cfg *criapi.ContainerConfig) (string, error) {
	resp, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(e.t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func (e *hostileRestoreEnv) remove(id string) {
	e.t.Helper()
	if _, err := e.d.Runtime.RemoveContainer(berthdtest.Ctx(e.t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		e.t.Fatalf("RemoveContainer: %v", err)
	}
}

// bundleSpec is the OCI spec berthd wrote for container id.
func (e *hostileRestoreEnv) bundleSpec(id string) specs.Spec {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.d.Root, "containers", id, "config.json"))
	if err != nil {
		e.t.Fatalf("bundle spec: %v", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		e.t.Fatalf("bundle spec: %v", err)
	}
	return s
}

// templateSpec is the spec of a container made (and removed) from
// e.config: what a real checkpoint of the request's container holds, so
// that an archive differs from the request only where the test edits it.
func (e *hostileRestoreEnv) templateSpec() specs.Spec {
	e.t.Helper()
	id, err := e.create(e.config("template"))
	if err != nil {
		e.t.Fatalf("CreateContainer template: %v", err)
	}
	s := e.bundleSpec(id)
	e.remove(id)
	return s
}

// archive writes a checkpoint archive of spec and config.dump cfg.
func (e *hostileRestoreEnv) archive(spec specs.Spec, cfg map[string]any) string {
	e.t.Helper()
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		e.t.Fatal(err)
	}
	return restoreArchive(e.t, e.t.TempDir(), []restoreArchiveEntry{
		{name: "config.dump", data: cfgJSON}, {name: "spec.dump", data: specJSON},
		{name: "deleted.files", data: []byte("[]")}, {name: "checkpoint/inventory.img", data: []byte("x")},
		{name: "rootfs-diff.tar", data: restoreTar(e.t, "tmp/restored", "ok\n")},
	})
}

// images is ListImages as sorted "id tags digests" lines.
func (e *hostileRestoreEnv) images() []string {
	e.t.Helper()
	resp, err := e.d.Image.ListImages(berthdtest.Ctx(e.t), &criapi.ListImagesRequest{})
	if err != nil {
		e.t.Fatalf("ListImages: %v", err)
	}
	var out []string
	for _, img := range resp.Images {
		tags, digests := slices.Clone(img.RepoTags), slices.Clone(img.RepoDigests)
		slices.Sort(tags)
		slices.Sort(digests)
		out = append(out, fmt.Sprintf("%s tags=%v digests=%v", img.Id, tags, digests))
	}
	slices.Sort(out)
	return out
}

// TestCheckpointRestoreKeepsTheRequestsMountsAnnotationsAndImages restores
// (CreateContainer with a checkpoint archive as the image) from archives
// that try what the anchors' restore CVEs let an archive do:
//
//   - CVE-2024-8676 (CRI-O took the mounts from the archive): spec.dump
//     names a host directory holding a marker file, at a destination the
//     request does not mount (refused: the mount points differ, nothing
//     left), or at the request's own /data (restored with the request's
//     source, never the archive's);
//   - CVE-2026-53492 (containerd re-applied the CDI annotations of the
//     checkpoint): spec.dump and config.dump carry cdi.k8s.io and NRI
//     device annotations for a CDI device configured on the node: the
//     restored spec has the request's annotations only and none of the
//     device's node, env, mount or hook;
//   - CVE-2026-50195 (containerd's import tagged a local image from the
//     archive's name): config.dump names busybox's reference with another
//     local image's ID, or an ID not in the store: ListImages is the same
//     before and after.
func TestCheckpointRestoreKeepsTheRequestsMountsAnnotationsAndImages(t *testing.T) {
	e := newHostileRestoreEnv(t)
	marker := filepath.Join(e.scratch, "host-secret")
	if err := os.MkdirAll(marker, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(marker, "marker"), []byte("host only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmpl := e.templateSpec()
	// The node's CDI works: the same annotation in a request (not a
	// restore) injects the device, so its absence below is the restore's
	// doing, not a CDI that injects nothing.
	ctl := e.config("cdi-control")
	ctl.Annotations = map[string]string{"cdi.k8s.io/control": "berth.test/fake=dev0"}
	ctlID, err := e.create(ctl)
	if err != nil {
		t.Fatalf("CreateContainer with a CDI device: %v", err)
	}
	if s := e.bundleSpec(ctlID); s.Linux == nil || !slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/berth-fake0" }) {
		t.Fatalf("CDI is not working on this node: the control container has no /dev/berth-fake0: %+v", s.Linux)
	}
	e.remove(ctlID)
	hooksBefore, _ := os.ReadFile(e.hookLog)
	dump := func(imageID string) map[string]any {
		return map[string]any{"id": "0123", "name": "restored", "rootfsImageRef": imageID,
			"rootfsImageName": e.reg.Ref("busybox:latest"), "rootfsImage": e.reg.Ref("busybox:latest")}
	}
	hostBind := specs.Mount{Destination: "/host-secret", Type: "bind", Source: marker, Options: []string{"rbind", "rw"}}
	hostile := map[string]string{
		"cdi.k8s.io/hostile":                          "berth.test/fake=dev0",
		"cdi.k8s.io/hostile-too":                      "berth.test/fake=dev1",
		"devices.noderesource.dev/container.restored": "- path: /dev/berth-nri\n  type: c\n  major: 1\n  minor: 3\n",
		"mounts.noderesource.dev/container.restored":  "- source: " + marker + "\n  destination: /nri-secret\n  type: bind\n  options: [rbind]\n",
	}

	scope := leakcheck.ForDaemon(e.d)
	for _, tc := range []struct {
		name string
		edit func(s *specs.Spec, cfg map[string]any)
		// refused, when set, is the error the restore must fail with.
		refused string
		code    codes.Code
	}{
		{name: "extra host mount", edit: func(s *specs.Spec, _ map[string]any) {
			s.Mounts = append(s.Mounts, hostBind)
		}, refused: "/host-secret", code: codes.FailedPrecondition},
		{name: "host source at the request's mount point", edit: func(s *specs.Spec, _ map[string]any) {
			for i := range s.Mounts {
				if s.Mounts[i].Destination == "/data" {
					s.Mounts[i].Source = marker
				}
			}
		}},
		{name: "CDI and NRI annotations", edit: func(s *specs.Spec, cfg map[string]any) {
			s.Annotations = hostile
			cfg["annotations"] = hostile
			cfg["labels"] = hostile
		}},
		{name: "another image under busybox's name", edit: func(_ *specs.Spec, cfg map[string]any) {
			cfg["rootfsImageRef"] = e.other
		}},
		{name: "busybox's ID under a new name", edit: func(_ *specs.Spec, cfg map[string]any) {
			cfg["rootfsImageName"] = e.reg.Ref("poisoned:latest")
			cfg["rootfsImage"] = e.reg.Ref("poisoned:latest")
		}},
		{name: "an image ID not in the store under busybox's name", edit: func(_ *specs.Spec, cfg map[string]any) {
			cfg["rootfsImageRef"] = "sha256:" + strings.Repeat("ab", 32)
		}, refused: "ab", code: codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, cfg := tmpl, dump(e.busybox)
			spec.Mounts = slices.Clone(tmpl.Mounts)
			tc.edit(&spec, cfg)
			archive := e.archive(spec, cfg)
			imagesBefore := e.images()
			before := leakcheck.Take(t, scope)
			req := e.config(strings.ReplaceAll(tc.name, " ", "-"))
			req.Image = &criapi.ImageSpec{Image: archive}
			id, err := e.create(req)
			if got := e.images(); !slices.Equal(got, imagesBefore) {
				t.Fatalf("the restore changed the image store:\nbefore %q\nafter  %q", imagesBefore, got)
			}
			if tc.refused != "" {
				if err == nil {
					s := e.bundleSpec(id)
					t.Fatalf("CreateContainer restored the hostile archive; its mounts: %+v", s.Mounts)
				}
				t.Logf("refused: %v", err)
				berthdtest.WantCode(t, err, tc.code)
				if !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("refused for another reason than %q: %v", tc.refused, err)
				}
				leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
				if es, _ := os.ReadDir(filepath.Join(e.d.Root, "checkpoints")); len(es) != 0 {
					t.Fatalf("left in %s: %v", filepath.Join(e.d.Root, "checkpoints"), es)
				}
				return
			}
			if err != nil {
				// Refusing is as safe; the test wants to see the restore
				// the request allows go through, though, so say why.
				t.Fatalf("CreateContainer refused a restore whose archive differs only in what it may not decide: %v", err)
			}
			t.Cleanup(func() { e.remove(id) })
			got := e.bundleSpec(id)
			for _, m := range got.Mounts {
				if m.Source == marker || strings.HasPrefix(m.Source, marker+"/") || m.Destination == "/host-secret" || m.Destination == "/nri-secret" {
					t.Fatalf("the restored container mounts the archive's host directory: %+v", m)
				}
				if m.Destination == "/data" && m.Source != e.dataDir {
					t.Fatalf("/data is mounted from %s, the request's source is %s", m.Source, e.dataDir)
				}
				if m.Destination == "/run/fake/info" {
					t.Fatalf("the restored container got the CDI device's mount: %+v", m)
				}
			}
			if !slices.ContainsFunc(got.Mounts, func(m specs.Mount) bool { return m.Destination == "/data" }) {
				t.Fatalf("the restored container lost the request's /data mount: %+v", got.Mounts)
			}
			for k := range hostile {
				if _, ok := got.Annotations[k]; ok {
					t.Fatalf("the restored spec has the archive's annotation %s: %v", k, got.Annotations)
				}
			}
			// berth, as containerd, writes only its io.kubernetes.cri.*
			// annotations into the spec, made from the request.
			for k := range got.Annotations {
				if !strings.HasPrefix(k, "io.kubernetes.cri.") {
					t.Fatalf("the restored spec has annotation %s: %v", k, got.Annotations)
				}
			}
			if n := got.Annotations["io.kubernetes.cri.container-name"]; n != req.Metadata.Name {
				t.Fatalf("the restored spec's container-name annotation is %q, the request's name %q", n, req.Metadata.Name)
			}
			if got.Linux != nil {
				for _, dev := range got.Linux.Devices {
					if strings.HasPrefix(dev.Path, "/dev/berth-") {
						t.Fatalf("the restored container got a device from the archive: %+v", dev)
					}
				}
			}
			if got.Process != nil {
				for _, kv := range got.Process.Env {
					if strings.HasPrefix(kv, "FAKE_DEVICE") {
						t.Fatalf("the restored container got the CDI device's env %s", kv)
					}
				}
			}
			if got.Hooks != nil && len(got.Hooks.CreateRuntime) != 0 {
				t.Fatalf("the restored spec has createRuntime hooks: %+v", got.Hooks.CreateRuntime)
			}
		})
	}
	if b, _ := os.ReadFile(e.hookLog); string(b) != string(hooksBefore) {
		t.Fatalf("the CDI device's hook ran for a restore: %q, before the restores %q", b, hooksBefore)
	}
}
