package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestStatusRuntimeHandlerFeatures: Status lists every handler plus the
// default again as "", each with what its runtime supports (probed with
// `<binary> --root <root> features` at start), and the node-wide features.
func TestStatusRuntimeHandlerFeatures(t *testing.T) {
	t.Parallel()
	// "old" is runc behind a wrapper without the features subcommand, as
	// a runtime that predates it (the subcommand follows the global
	// options, --root and the handler's own).
	old := filepath.Join(t.TempDir(), "old-runc")
	script := "#!/bin/sh\nfor a; do [ \"$a\" = features ] && exit 1; done\nexec /usr/sbin/runc \"$@\"\n"
	if err := os.WriteFile(old, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.RuntimeHandlers = map[string]config.RuntimeHandler{"runc": {Binary: "runc"}, "old": {Binary: old}}
	}})
	resp, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetFeatures().GetSupplementalGroupsPolicy() {
		t.Fatalf("features: %+v", resp.GetFeatures())
	}
	got := map[string]*criapi.RuntimeHandlerFeatures{}
	for _, h := range resp.GetRuntimeHandlers() {
		got[h.GetName()] = h.GetFeatures()
	}
	if len(got) != 3 || len(resp.GetRuntimeHandlers()) != 3 {
		t.Fatalf("handlers: %+v", resp.GetRuntimeHandlers())
	}
	// This daemon's scratch dir (0700) keeps a user namespace's root out
	// of its rootfs, so no handler offers user namespaces
	// (TestUsernsStatusReportsSupport has one that does).
	for name, rro := range map[string]bool{"": true, "runc": true, "old": false} {
		f := got[name]
		if f == nil || f.GetRecursiveReadOnlyMounts() != rro || f.GetUserNamespaces() {
			t.Errorf("handler %q: features %+v, want recursive_read_only_mounts=%v user_namespaces=false", name, f, rro)
		}
	}

	// A pod on the handler without rro refuses a recursive read-only mount.
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	pull(t, d, reg.Ref("busybox:latest"), nil)
	e := &ctrEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	e.podCfg = podConfig("oldhandler")
	e.podCfg.LogDirectory = e.logDir
	pr, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: e.podCfg, RuntimeHandler: "old"})
	if err != nil {
		t.Fatal(err)
	}
	e.pod = pr.PodSandboxId
	cfg := e.config("rro", "true")
	cfg.Mounts = []*criapi.Mount{{ContainerPath: "/mnt", HostPath: t.TempDir(), Readonly: true, RecursiveReadOnly: true}}
	_, err = d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	stopRemove(t, d, e.pod)
}

// rroHostPath is a host dir with a tmpfs mounted at its "tmpfs" subdir,
// as critest builds it: only a recursive read-only bind makes the
// submount read-only too.
func rroHostPath(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	sub := filepath.Join(dir, "tmpfs")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("none", sub, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	return dir
}

// TestContainerRecursiveReadOnlyMounts: a plain read-only bind leaves a
// submount writable, a recursive one does not; rro with non-private
// propagation or without readonly is InvalidArgument.
func TestContainerRecursiveReadOnlyMounts(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	host := rroHostPath(t)

	cfg := e.config("ro", "sleep", "3600")
	cfg.Mounts = []*criapi.Mount{{ContainerPath: "/mnt", HostPath: host, Readonly: true, SelinuxRelabel: true}}
	id := e.run(cfg)
	r, err := execSync(t, e.d, id, 10, "sh", "-c", "touch /mnt/x 2>&1; touch /mnt/tmpfs/file && echo sub-ok")
	if err != nil || !strings.Contains(string(r.Stdout), "Read-only file system") || !strings.Contains(string(r.Stdout), "sub-ok") {
		t.Fatalf("non-recursive read-only: %+v, %v", r, err)
	}

	cfg = e.config("rro", "sleep", "3600")
	cfg.Mounts = []*criapi.Mount{{ContainerPath: "/mnt", HostPath: host, Readonly: true, RecursiveReadOnly: true, SelinuxRelabel: true}}
	id = e.run(cfg)
	r, err = execSync(t, e.d, id, 10, "sh", "-c", "touch /mnt/tmpfs/foo 2>&1")
	if err != nil || r.ExitCode == 0 || !strings.Contains(string(r.Stdout), "Read-only file system") {
		t.Fatalf("recursive read-only: %+v, %v", r, err)
	}

	for name, m := range map[string]*criapi.Mount{
		"host-to-container": {Propagation: criapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER, Readonly: true},
		"bidirectional":     {Propagation: criapi.MountPropagation_PROPAGATION_BIDIRECTIONAL, Readonly: true},
		"readonly-false":    {Readonly: false},
	} {
		m.ContainerPath, m.HostPath, m.RecursiveReadOnly, m.SelinuxRelabel = "/mnt", host, true, true
		cfg := e.config("bad-"+name, "true")
		cfg.Mounts = []*criapi.Mount{m}
		_, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

// TestContainerSupplementalGroupsPolicy: Merge adds the groups the image's
// /etc/group gives the user, Strict only the config's; status reports the
// identity the process has, for the first process and exec alike.
func TestContainerSupplementalGroupsPolicy(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	for _, tc := range []struct {
		policy criapi.SupplementalGroupsPolicy
		want   []int64
	}{
		{criapi.SupplementalGroupsPolicy_Merge, []int64{testimages.TestGID, 1234, testimages.ExtraGID}},
		{criapi.SupplementalGroupsPolicy_Strict, []int64{testimages.TestGID, 1234}},
	} {
		cfg := e.config("groups-"+strings.ToLower(tc.policy.String()), "sh", "-c", "id -G; sleep 3600")
		sc := cfg.Linux.SecurityContext
		sc.RunAsUser = &criapi.Int64Value{Value: testimages.TestUID}
		sc.SupplementalGroups = []int64{1234}
		sc.SupplementalGroupsPolicy = tc.policy
		id := e.run(cfg)
		var want []string
		for _, g := range tc.want {
			want = append(want, strconv.FormatInt(g, 10))
		}
		r, err := execSync(t, e.d, id, 10, "id", "-G")
		if err != nil || string(r.Stdout) != strings.Join(want, " ")+"\n" {
			t.Fatalf("%s: exec id -G: %+v, %v; want %q", tc.policy, r, err, want)
		}
		u := e.status(id).GetUser().GetLinux()
		groups := slices.Clone(u.GetSupplementalGroups())
		slices.Sort(groups)
		if u.GetUid() != testimages.TestUID || u.GetGid() != testimages.TestGID || !slices.Equal(groups, tc.want) {
			t.Fatalf("%s: status user %+v, want groups %v", tc.policy, u, tc.want)
		}
	}
}

// leftovers lists the image leases and the mounts under the daemon's root
// that outlive a container: there must be none once it is gone.
func leftovers(t *testing.T, d *berthdtest.Daemon) []string {
	t.Helper()
	var out []string
	es, err := os.ReadDir(filepath.Join(d.Root, "images", "leases"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		out = append(out, "lease "+e.Name())
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], filepath.Join(d.Root, "containers")+"/") {
			out = append(out, "mount "+f[4])
		}
	}
	return out
}

// TestContainerImageVolume: a mount naming an image shows that image's
// files read-only (but executable) at the container path, image_sub_path
// picks a directory of it, status reports the image and its ID, and
// readonly: false or a missing sub path is InvalidArgument with nothing
// left behind; remove releases every lease and mount.
func TestContainerImageVolume(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t, "busybox:latest")
	httpdRef := pull(t, e.d, e.reg.Ref("busybox-httpd:latest"), nil)
	httpd := &criapi.ImageSpec{Image: e.reg.Ref("busybox-httpd:latest")}

	cfg := e.config("vol", "sleep", "3600")
	cfg.Mounts = []*criapi.Mount{
		{ContainerPath: "/vol", Readonly: true, Image: httpd},
		{ContainerPath: "/www", Readonly: true, Image: httpd, ImageSubPath: "www"},
	}
	id := e.run(cfg)
	r, err := execSync(t, e.d, id, 10, "sh", "-c",
		"ls -A /vol/bin/sh && /vol/bin/ls /vol >/dev/null && echo exec-ok; touch /vol/x 2>&1; cat /www/index.html; ls /www/www 2>&1 >/dev/null || echo no-nested")
	out := string(r.GetStdout())
	if err != nil || !strings.Contains(out, "exec-ok") || !strings.Contains(out, "Read-only file system") ||
		!strings.Contains(out, testimages.HTTPDIndex) || !strings.Contains(out, "no-nested") {
		t.Fatalf("image volume: %q, %v", out, err)
	}
	mounts := map[string]*criapi.Mount{}
	for _, m := range e.status(id).GetMounts() {
		mounts[m.GetContainerPath()] = m
	}
	for path, sub := range map[string]string{"/vol": "", "/www": "www"} {
		m := mounts[path]
		if m.GetImage().GetImage() != httpd.Image || m.GetImage().GetImageRef() != httpdRef || !m.GetReadonly() || m.GetImageSubPath() != sub {
			t.Errorf("status mount %s: %+v, want image %s ref %s", path, m, httpd.Image, httpdRef)
		}
	}

	for name, mounts := range map[string][]*criapi.Mount{
		"readonly-false": {{ContainerPath: "/vol", Readonly: false, Image: httpd}},
		// The first volume is mounted before the second fails: it must be undone.
		"missing-sub-path": {
			{ContainerPath: "/vol", Readonly: true, Image: httpd},
			{ContainerPath: "/www", Readonly: true, Image: httpd, ImageSubPath: "not-existing"},
		},
		// The volume is mounted, then spec generation refuses another mount.
		"bad-host-mount": {
			{ContainerPath: "/vol", Readonly: true, Image: httpd},
			{ContainerPath: "/data", HostPath: "relative/path"},
		},
	} {
		cfg := e.config("bad-"+name, "true")
		cfg.Mounts = mounts
		_, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	// Only the running container's three leases and three mounts (rootfs
	// and two volumes) remain.
	if got := leftovers(t, e.d); len(got) != 3+3 {
		t.Fatalf("before remove: %q", got)
	}
	// A restarted daemon still knows the volumes to undo.
	e.d.Restart()
	if m := e.status(id).GetMounts(); len(m) < 2 || m[0].GetImage().GetImageRef() != httpdRef {
		t.Fatalf("status mounts after restart: %+v", m)
	}
	if _, err := e.d.Runtime.RemoveContainer(berthdtest.Ctx(t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if got := leftovers(t, e.d); len(got) != 0 {
		t.Fatalf("left after remove: %q", got)
	}
}

// TestContainerMaskedPathSymlink: masking /bin/ls, a symlink to busybox in
// the image, masks the link only: /bin/ls cannot be run, while sh and
// every other applet (the same busybox) still work.
func TestContainerMaskedPathSymlink(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := e.config("masked", "sleep", "3600")
	cfg.Linux.SecurityContext.MaskedPaths = []string{"/bin/ls"}
	id := e.run(cfg)
	r, err := execSync(t, e.d, id, 10, "/bin/sh", "-c", "/bin/ls")
	if err != nil || r.ExitCode == 0 || string(r.Stderr) != "/bin/sh: /bin/ls: Permission denied\n" {
		t.Fatalf("masked /bin/ls: %+v, %v", r, err)
	}
	r, err = execSync(t, e.d, id, 10, "sh", "-c", "stat -c %F /bin/ls; readlink /bin/cat; /bin/cat /etc/hostname >/dev/null && echo cat-ok")
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "character special file\nbusybox\ncat-ok\n" {
		t.Fatalf("rest of busybox: %+v, %v", r, err)
	}
	// The image itself is untouched: a new container sees the link again.
	r2, _ := e.output(e.config("plain", "readlink", "/bin/ls"))
	if len(r2) != 1 || r2[0] != "busybox" {
		t.Fatalf("plain container /bin/ls: %q", r2)
	}
}
