package security

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// injPod is a daemon, a registry the test pushes its hostile images to,
// and one pod.
type injPod struct {
	t      *testing.T
	d      *berthdtest.Daemon
	reg    *testimages.Registry
	pod    string
	podCfg *criapi.PodSandboxConfig
}

func newInjPod(t *testing.T, edit func(*criapi.PodSandboxConfig)) *injPod {
	t.Helper()
	p := &injPod{t: t, d: berthdtest.Start(t, berthdtest.Options{}), reg: testimages.StartRegistry(t)}
	name := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	p.podCfg = &criapi.PodSandboxConfig{
		Metadata: &criapi.PodSandboxMetadata{Name: name, Namespace: "security", Uid: name + "-uid"},
		Hostname: "inj",
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
	if edit != nil {
		edit(p.podCfg)
	}
	resp, err := p.d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: p.podCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	p.pod = resp.PodSandboxId
	return p
}

// push uploads img as repoTag and pulls it into the daemon; it returns
// the reference to use in a container config.
func (p *injPod) push(repoTag string, img v1.Image) string {
	p.t.Helper()
	p.reg.Push(p.t, repoTag, img)
	ref := p.reg.Ref(repoTag)
	if _, err := p.d.Image.PullImage(berthdtest.Ctx(p.t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		p.t.Fatalf("pull %s: %v", ref, err)
	}
	return ref
}

func (p *injPod) config(name, image string, args ...string) *criapi.ContainerConfig {
	return &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: image},
		Command:  args,
		Labels:   map[string]string{"name": name},
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

func (p *injPod) create(cfg *criapi.ContainerConfig) (string, error) {
	resp, err := p.d.Runtime.CreateContainer(berthdtest.Ctx(p.t), &criapi.CreateContainerRequest{PodSandboxId: p.pod, Config: cfg, SandboxConfig: p.podCfg})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func (p *injPod) run(cfg *criapi.ContainerConfig) string {
	p.t.Helper()
	id, err := p.create(cfg)
	if err != nil {
		p.t.Fatalf("CreateContainer %s: %v", cfg.Metadata.Name, err)
	}
	if _, err := p.d.Runtime.StartContainer(berthdtest.Ctx(p.t), &criapi.StartContainerRequest{ContainerId: id}); err != nil {
		p.t.Fatalf("StartContainer %s: %v", cfg.Metadata.Name, err)
	}
	return id
}

// sh runs script in the container and returns its stdout and stderr.
func (p *injPod) sh(id, script string) string {
	p.t.Helper()
	r, err := p.d.Runtime.ExecSync(berthdtest.Ctx(p.t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", script}, Timeout: 20})
	if err != nil {
		p.t.Fatalf("exec %q: %v", script, err)
	}
	return string(r.Stdout) + string(r.Stderr)
}

// remove stops and removes the container (what runs at stop, e.g. a
// systemd ExecStopPost, runs then).
func (p *injPod) remove(id string) {
	p.t.Helper()
	if _, err := p.d.Runtime.StopContainer(berthdtest.Ctx(p.t), &criapi.StopContainerRequest{ContainerId: id, Timeout: 1}); err != nil {
		p.t.Fatalf("StopContainer: %v", err)
	}
	if _, err := p.d.Runtime.RemoveContainer(berthdtest.Ctx(p.t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		p.t.Fatalf("RemoveContainer: %v", err)
	}
}

// bundleSpec is the container's config.json as the OCI runtime read it.
func (p *injPod) bundleSpec(id string) *specs.Spec {
	p.t.Helper()
	data, err := os.ReadFile(filepath.Join(p.d.Root, "containers", id, "config.json"))
	if err != nil {
		p.t.Fatalf("read bundle: %v", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		p.t.Fatalf("parse bundle: %v", err)
	}
	return &s
}

// injImage is the busybox base with extra layers and config cfg.
func injImage(t *testing.T, extra [][]testimages.File, cfg v1.Config) v1.Image {
	t.Helper()
	img, err := testimages.Build(extra, cfg)
	return testimages.Must(t, img, err)
}

// hostTree is what a host directory holds: each path below it with its
// type, mode and, for a symlink, target, for a before/after comparison.
func hostTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String() + fmt.Sprintf(" %d", fi.Size())
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			v += " -> " + target
		}
		out[strings.TrimPrefix(p, dir)] = v
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

// secretCanary is a host directory holding one file, secret, whose
// content "host-secret" must never show in a container, and its tree
// for sameTree.
func secretCanary(t *testing.T) (dir string, before map[string]string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("host-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, hostTree(t, dir)
}

func sameTree(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	after := hostTree(t, dir)
	if !maps.Equal(before, after) {
		t.Fatalf("the host directory %s changed:\nbefore %q\nafter  %q", dir, before, after)
	}
}

// escape is a relative symlink target that climbs out of any rootfs to
// the host path abs.
func escape(abs string) string {
	return strings.Repeat("../", 24) + strings.TrimPrefix(abs, "/")
}

// TestImageLabelsAndPodAnnotationsNeverReachRuntime: an image's config
// labels (the author's) and a pod's annotations and labels (any user who
// may create pods) carry the keys that an OCI runtime, systemd or
// containerd act upon: runc's org.systemd.property.* (CVE-2024-3154,
// CRI-O passed pod annotations to runc), crun's run.oci.*, CRI-O's own
// io.kubernetes.cri-o.*, containerd's restart log URI (CVE-2026-53488:
// image labels copied onto the container ran binary://), and spoofs of
// berth's own io.kubernetes.cri.* keys. None reaches the bundle's
// config.json, nor the container's status or labels, and no host
// command runs across create, start, exec, stop and remove.
func TestImageLabelsAndPodAnnotationsNeverReachRuntime(t *testing.T) {
	canary := t.TempDir()
	touch := func(name string) string { return filepath.Join(canary, name) }
	hostile := map[string]string{
		"org.systemd.property.ExecStartPre":        "/bin/touch " + touch("systemd-pre"),
		"org.systemd.property.ExecStopPost":        "['/bin/touch', '" + touch("systemd-post") + "']",
		"org.systemd.property.Delegate":            "yes",
		"run.oci.keep_original_groups":             "1",
		"run.oci.hooks.stdout":                     touch("crun-hook"),
		"io.kubernetes.cri-o.Devices":              "/dev/sda:/dev/sda:rwm",
		"io.kubernetes.cri-o.userns-mode":          "host",
		"containerd.io/restart.loguri":             "binary:///bin/touch?" + touch("loguri"),
		"containerd.io/restart.status":             "running",
		"io.kubernetes.cri.sandbox-id":             "spoofed-sandbox",
		"io.kubernetes.cri.container-type":         "sandbox",
		"io.kubernetes.cri.sandbox-namespace":      "kube-system",
		"io.katacontainers.config.hypervisor.path": touch("kata"),
	}
	p := newInjPod(t, func(c *criapi.PodSandboxConfig) {
		c.Annotations = maps.Clone(hostile)
		c.Labels = maps.Clone(hostile)
	})
	ref := p.push("labelled:1", injImage(t, nil, v1.Config{
		Cmd: []string{"sh"}, Labels: maps.Clone(hostile),
	}))
	cfg := p.config("labelled", ref, "sleep", "3600")
	cfg.Annotations = map[string]string{"own": "annotation"}
	id := p.run(cfg)
	p.sh(id, "true")

	wantAnn := map[string]string{
		"io.kubernetes.cri.container-type":    "container",
		"io.kubernetes.cri.sandbox-id":        p.pod,
		"io.kubernetes.cri.sandbox-name":      p.podCfg.Metadata.Name,
		"io.kubernetes.cri.sandbox-namespace": "security",
		"io.kubernetes.cri.sandbox-uid":       p.podCfg.Metadata.Uid,
		"io.kubernetes.cri.container-name":    "labelled",
		"io.kubernetes.cri.image-name":        ref,
	}
	s := p.bundleSpec(id)
	if !maps.Equal(s.Annotations, wantAnn) {
		t.Errorf("config.json annotations:\n got %q\nwant %q", s.Annotations, wantAnn)
	}
	if s.Hooks != nil {
		t.Errorf("config.json has hooks: %+v", s.Hooks)
	}
	st, err := p.d.Runtime.ContainerStatus(berthdtest.Ctx(t), &criapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(st.Status.Labels, cfg.Labels) || !maps.Equal(st.Status.Annotations, cfg.Annotations) {
		t.Errorf("status labels %q annotations %q, want the config's own %q %q",
			st.Status.Labels, st.Status.Annotations, cfg.Labels, cfg.Annotations)
	}
	list, err := p.d.Runtime.ListContainers(berthdtest.Ctx(t), &criapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Containers {
		if c.Id == id && (!maps.Equal(c.Labels, cfg.Labels) || !maps.Equal(c.Annotations, cfg.Annotations)) {
			t.Errorf("listed labels %q annotations %q", c.Labels, c.Annotations)
		}
	}
	p.remove(id)
	if es, err := os.ReadDir(canary); err != nil || len(es) != 0 {
		t.Fatalf("a host command ran: %s holds %v (%v)", canary, es, err)
	}
}

// TestImageConfigVolumesAreIgnored: an image config VOLUME that climbs
// out of the rootfs (CVE-2022-23648: containerd copied the host path's
// files into the container) leaves no host path mounted into or copied
// into the container, and the host directory unchanged.
func TestImageConfigVolumesAreIgnored(t *testing.T) {
	canary, before := secretCanary(t)
	p := newInjPod(t, nil)
	ref := p.push("volumes:1", injImage(t, nil, v1.Config{
		Cmd: []string{"sh"},
		Volumes: map[string]struct{}{
			"/../../../../../../../../../.." + canary: {},
			"/vol/../../../../../../../.." + canary:   {},
			"/data":                                   {},
		},
	}))
	id := p.run(p.config("volumes", ref, "sleep", "3600"))
	out := p.sh(id, "cat "+canary+"/secret /data/secret 2>&1; ls -A /data "+canary+" 2>&1; echo done")
	if strings.Contains(out, "host-secret") || !strings.Contains(out, "done") {
		t.Fatalf("the host's secret shows in the container: %q", out)
	}
	for _, m := range p.bundleSpec(id).Mounts {
		if strings.HasPrefix(m.Source, canary) || strings.Contains(m.Destination, "..") || m.Destination == "/data" {
			t.Errorf("config.json mounts the image's VOLUME: %+v", m)
		}
	}
	p.remove(id)
	sameTree(t, canary, before)
}

// TestImageVolumeSubPathSymlinkStaysInside: a CRI image volume's
// sub_path that is, or passes through, a symlink leading out of the
// image is resolved inside the image (and refused where nothing is
// there): the container never sees the host's files.
func TestImageVolumeSubPathSymlinkStaysInside(t *testing.T) {
	canary, before := secretCanary(t)
	p := newInjPod(t, nil)
	busybox := p.push("busybox:latest", injImage(t, nil, v1.Config{Cmd: []string{"sh"}}))
	vol := p.push("evilvol:1", injImage(t, [][]testimages.File{{
		{Name: "rel", Symlink: escape(canary)},
		{Name: "abs", Symlink: canary},
		{Name: "dir", Dir: true},
		{Name: "dir/up", Symlink: "../../../../../../../../../../.." + canary},
		{Name: "inside", Dir: true},
		{Name: "inside/marker", Data: []byte("image-marker\n")},
		{Name: "toinside", Symlink: "/inside"},
	}}, v1.Config{Cmd: []string{"sh"}}))
	for i, sub := range []string{"rel", "abs", "dir/up", "rel/secret", "abs/secret", "../../../../../../../.." + canary, "toinside"} {
		name := strings.ReplaceAll(sub, "/", "_")
		if strings.HasPrefix(sub, "..") {
			name = "dotdot"
		}
		t.Run(name, func(t *testing.T) {
			cfg := p.config(fmt.Sprintf("sub%d", i), busybox, "sleep", "3600")
			cfg.Mounts = []*criapi.Mount{{ContainerPath: "/v", Readonly: true, Image: &criapi.ImageSpec{Image: vol}, ImageSubPath: sub}}
			id, err := p.create(cfg)
			if err != nil {
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("create: %v, want success inside the image or InvalidArgument", err)
				}
				return
			}
			if _, err := p.d.Runtime.StartContainer(berthdtest.Ctx(t), &criapi.StartContainerRequest{ContainerId: id}); err != nil {
				t.Fatalf("StartContainer: %v", err)
			}
			out := p.sh(id, "cat /v /v/secret /v/marker 2>&1; ls -A /v 2>&1; echo done")
			if strings.Contains(out, "host-secret") || !strings.Contains(out, "done") {
				t.Fatalf("sub_path %q shows the host: %q", sub, out)
			}
			if sub == "toinside" && !strings.Contains(out, "image-marker") {
				t.Fatalf("sub_path through a symlink inside the image: %q", out)
			}
			for _, m := range p.bundleSpec(id).Mounts {
				if strings.HasPrefix(m.Source, canary) {
					t.Errorf("config.json binds the host path: %+v", m)
				}
			}
			p.remove(id)
		})
	}
	sameTree(t, canary, before)
}

// TestImageEtcSymlinkWritesNothingOnHost: an image whose /etc is a
// symlink climbing out of the rootfs (relative or absolute), and whose
// masked paths' parents are such symlinks (CVE-2024-5154: CRI-O created
// /etc/mtab on the host). berth's writes into the rootfs (replacing
// masked symlinks, its own /etc/hostname, /etc/hosts, /etc/resolv.conf
// mounts, the user database read) and runc's mount points stay inside
// the rootfs: the host directory the links name is unchanged, and a
// symlink there that a masked path names is not replaced.
func TestImageEtcSymlinkWritesNothingOnHost(t *testing.T) {
	canary := t.TempDir()
	for _, d := range []string{"etc", "data"} {
		if err := os.MkdirAll(filepath.Join(canary, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(canary, "etc/passwd"), []byte("evil:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"etc/mtab", "data/masked", "masked"} {
		if err := os.Symlink("target-on-host", filepath.Join(canary, l)); err != nil {
			t.Fatal(err)
		}
	}
	before := hostTree(t, canary)
	p := newInjPod(t, nil)
	for _, tc := range []struct{ name, link string }{
		{"relative", escape(canary)},
		{"absolute", canary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := p.push("etclink:"+tc.name, injImage(t, [][]testimages.File{{
				{Name: "etc", Symlink: tc.link + "/etc"},
				{Name: "data", Symlink: tc.link + "/data"},
				{Name: "link", Symlink: tc.link},
			}}, v1.Config{Cmd: []string{"sh"}}))
			cfg := p.config("etclink-"+tc.name, ref, "sleep", "3600")
			cfg.Linux.SecurityContext.MaskedPaths = []string{"/etc/mtab", "/data/masked", "/link/masked", "/proc/kcore"}
			id := p.run(cfg)
			out := p.sh(id, "readlink /etc; cat /etc/hostname; echo x > /etc/written 2>&1; ls -A /etc; echo done")
			if !strings.Contains(out, tc.link+"/etc\n") || !strings.Contains(out, "inj") || !strings.Contains(out, "done") {
				t.Fatalf("container: %q", out)
			}
			p.remove(id)
			sameTree(t, canary, before)
		})
	}
	// The user database is read inside the rootfs too: the host's
	// passwd behind the link does not resolve the image's USER.
	ref := p.push("etclink:user", injImage(t, [][]testimages.File{{
		{Name: "etc", Symlink: escape(canary) + "/etc"},
	}}, v1.Config{Cmd: []string{"sh"}, User: "evil"}))
	_, err := p.create(p.config("etclink-user", ref, "sleep", "3600"))
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	sameTree(t, canary, before)
}

// TestImageNumericUserNeverRoot: an image USER that ImageStatus reports
// as a non-zero uid (what the kubelet's runAsNonRoot check reads) but
// that berth would look up as a name in the image's own /etc/passwd,
// mapped there to uid 0 (CVE-2026-46680; CVE-2024-40635 wrapped 2^32 to
// root). The create is InvalidArgument; nothing runs as root.
func TestImageNumericUserNeverRoot(t *testing.T) {
	p := newInjPod(t, nil)
	passwd := "root:x:0:0:root:/root:/bin/sh\n-1:x:0:0::/:/bin/sh\n4294967296:x:0:0::/:/bin/sh\n-4294967296:x:0:0::/:/bin/sh\n"
	for i, user := range []string{"-1", "4294967296", "-4294967296", "1000:-1"} {
		t.Run(user, func(t *testing.T) {
			ref := p.push(fmt.Sprintf("numuser:%d", i), injImage(t, [][]testimages.File{{
				{Name: "etc", Dir: true},
				{Name: "etc/passwd", Data: []byte(passwd)},
			}}, v1.Config{Cmd: []string{"sh"}, User: user}))
			img, err := p.d.Image.ImageStatus(berthdtest.Ctx(t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: ref}})
			if err != nil {
				t.Fatal(err)
			}
			if u := img.GetImage().GetUid(); u != nil && u.GetValue() == 0 {
				t.Fatalf("ImageStatus says uid 0: the kubelet would refuse it anyway")
			}
			cfg := p.config(fmt.Sprintf("numuser%d", i), ref, "sh", "-c", "id -u; sleep 3600")
			id, err := p.create(cfg)
			if err == nil {
				if _, err := p.d.Runtime.StartContainer(berthdtest.Ctx(t), &criapi.StartContainerRequest{ContainerId: id}); err == nil {
					t.Logf("id -u in the container: %q", p.sh(id, "id -u"))
				}
				t.Fatalf("image USER %q (ImageStatus uid %v) created a container as uid %d",
					user, img.GetImage().GetUid(), p.bundleSpec(id).Process.User.UID)
			}
			berthdtest.WantCode(t, err, codes.InvalidArgument)
		})
	}
}

// procKiB is the field (VmRSS, VmHWM) of /proc/<pid>/status, in KiB.
func procKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kib); err != nil {
				t.Fatalf("%s: %q: %v", field, l, err)
			}
			return kib
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestImageUserDatabaseMemoryBounded: an image whose /etc/group is 16
// lines of 1 MiB "a,a,a,…" (within the 16 MiB file cap) and whose user
// "a" is in each (CVE-2026-47262, CVE-2025-4437). Resolving the user's
// groups split every member list: 8 MiB of string headers per line.
// berthd's peak RSS across the create grows by a few MiB at most.
func TestImageUserDatabaseMemoryBounded(t *testing.T) {
	p := newInjPod(t, nil)
	var group strings.Builder
	group.WriteString("root:x:0:\n")
	for i := range 16 {
		start := group.Len()
		fmt.Fprintf(&group, "g%d:x:%d:", i, 100+i)
		for group.Len()-start < 1<<20-16 {
			group.WriteString("a,")
		}
		group.WriteString("a\n")
	}
	ref := p.push("bigdb:1", injImage(t, [][]testimages.File{{
		{Name: "etc", Dir: true},
		{Name: "etc/passwd", Data: []byte("root:x:0:0::/root:/bin/sh\na:x:1000:1000::/:/bin/sh\n")},
		{Name: "etc/group", Data: []byte(group.String())},
	}}, v1.Config{Cmd: []string{"sh"}, User: "a"}))
	pid := p.d.Pid()
	// Reset the peak to the current RSS (proc(5): clear_refs 5).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Skipf("cannot reset berthd's peak RSS: %v", err)
	}
	base := procKiB(t, pid, "VmHWM")
	id, err := p.create(p.config("bigdb", ref, "sleep", "3600"))
	peak := procKiB(t, pid, "VmHWM")
	t.Logf("berthd peak RSS %d MiB -> %d MiB across the create (%v)", base>>10, peak>>10, err)
	if err != nil {
		berthdtest.WantCode(t, err, codes.InvalidArgument)
	} else if gids := p.bundleSpec(id).Process.User.AdditionalGids; len(gids) != 17 {
		t.Errorf("additional gids %v, want the primary and the 16 groups", gids)
	}
	if grew := peak - base; grew > 48<<10 {
		t.Fatalf("berthd's peak RSS grew by %d MiB resolving a 16 MiB /etc/group", grew>>10)
	}
}
