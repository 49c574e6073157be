package security

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// The CVE-2021-41103 class (docs/decisions/3400): an unprivileged host
// user must reach nothing of berthd's state tree beyond the two top
// directories, which it may only traverse: not a container's upper dir or
// merged rootfs (a container can plant a setuid-root file there), not an
// image layer, not a pod's /dev/shm, files or namespace pins.

// stateTreeNobody is the unprivileged host user of these tests.
const stateTreeNobody = 65534

// stateTreeEnv is a berthd with a running pod and container, and a user
// namespace pod with a running container where the node runs them.
type stateTreeEnv struct {
	d              *berthdtest.Daemon
	reg            *testimages.Registry
	pod, ctr       string
	podCfg         *criapi.PodSandboxConfig
	usernsPod      string
	usernsCtr      string
	usernsPodShm   string
	podShm, podLog string
}

// stateTreeMapping is the user namespace pod's mapping: container 0..65535
// is host 200000..265535, a range no host user holds.
var stateTreeMapping = []*criapi.IDMapping{{ContainerId: 0, HostId: 200000, Length: 65536}}

// startStateTreeEnv starts berthd in a scratch dir others may search (as
// /var/lib and /run are), so that only berthd's own modes stand between
// the host user and its tree.
func startStateTreeEnv(t *testing.T) *stateTreeEnv {
	t.Helper()
	if _, err := os.Stat(testimages.BusyboxPath); err != nil {
		t.Skipf("the host user's probes need %s: %v", testimages.BusyboxPath, err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		if err := os.Chmod(filepath.Dir(c.Root), 0o711); err != nil {
			t.Fatal(err)
		}
	}})
	e := &stateTreeEnv{d: d, reg: testimages.StartRegistry(t)}
	e.reg.PushStandard(t)
	ref := e.reg.Ref(testimages.BusyboxRef)
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	e.podLog = filepath.Join(d.Dir, "podlogs")
	e.podCfg = stateTreePodConfig("statetree", nil)
	e.podCfg.LogDirectory = e.podLog
	e.pod, e.podShm = e.runPod(t, e.podCfg)
	e.ctr = e.runContainer(t, e.pod, e.podCfg, nil, "ctr")

	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.RuntimeHandlers) > 0 && st.RuntimeHandlers[0].GetFeatures().GetUserNamespaces() {
		opts := e.usernsOpts()
		cfg := stateTreePodConfig("statetree-userns", opts)
		cfg.LogDirectory = e.podLog
		e.usernsPod, e.usernsPodShm = e.runPod(t, cfg)
		e.usernsCtr = e.runContainer(t, e.usernsPod, cfg, opts, "ctr")
	} else {
		t.Log("this node runs no user namespace pods; only the plain pod is tried")
	}
	return e
}

func (e *stateTreeEnv) usernsOpts() *criapi.UserNamespace {
	return &criapi.UserNamespace{Mode: criapi.NamespaceMode_POD, Uids: stateTreeMapping, Gids: stateTreeMapping}
}

func stateTreePodConfig(name string, userns *criapi.UserNamespace) *criapi.PodSandboxConfig {
	return &criapi.PodSandboxConfig{
		Metadata: &criapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: name + "-uid"},
		Hostname: name,
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER, UsernsOptions: userns},
		}},
	}
}

// runPod runs cfg and returns its ID and /dev/shm path.
func (e *stateTreeEnv) runPod(t *testing.T, cfg *criapi.PodSandboxConfig) (string, string) {
	t.Helper()
	resp, err := e.d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", cfg.Metadata.Name, err)
	}
	st, err := e.d.Runtime.PodSandboxStatus(berthdtest.Ctx(t), &criapi.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		ShmPath string `json:"shmPath"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || info.ShmPath == "" {
		t.Fatalf("pod %s: no shmPath in verbose info %q: %v", resp.PodSandboxId, st.Info["info"], err)
	}
	return resp.PodSandboxId, info.ShmPath
}

// runContainer runs a busybox sleeper in pod and returns its ID.
func (e *stateTreeEnv) runContainer(t *testing.T, pod string, podCfg *criapi.PodSandboxConfig, userns *criapi.UserNamespace, suffix string) string {
	t.Helper()
	name := podCfg.Metadata.Name + "-" + suffix
	cfg := &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: e.reg.Ref(testimages.BusyboxRef)},
		Command:  []string{"sleep", "3600"},
		LogPath:  name + ".log",
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER, UsernsOptions: userns},
		}},
	}
	resp, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		t.Fatalf("CreateContainer %s: %v", name, err)
	}
	if _, err := e.d.Runtime.StartContainer(berthdtest.Ctx(t), &criapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatalf("StartContainer %s: %v", name, err)
	}
	return resp.ContainerId
}

// exec runs cmd in container id and fails the test unless it exits 0.
func (e *stateTreeEnv) exec(t *testing.T, id string, cmd ...string) string {
	t.Helper()
	r, err := e.d.Runtime.ExecSync(berthdtest.Ctx(t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 30})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %v, exit %d, stdout %q, stderr %q", cmd, id, err, r.GetExitCode(), r.GetStdout(), r.GetStderr())
	}
	return string(r.Stdout)
}

// stateTreeMount is one line of /proc/self/mountinfo.
type stateTreeMount struct {
	point, fstype string
	opts, super   []string
}

func stateTreeMounts(t *testing.T, path string) []stateTreeMount {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []stateTreeMount
	for line := range strings.Lines(string(data)) {
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 {
			continue
		}
		out = append(out, stateTreeMount{point: f[4], opts: strings.Split(f[5], ","), fstype: g[0], super: strings.Split(g[2], ",")})
	}
	return out
}

// upperDir is the upperdir of the overlay at <root>/containers/<id>/rootfs,
// as any host user reads it in /proc/self/mountinfo.
func (e *stateTreeEnv) upperDir(t *testing.T, id string) (rootfs, upper string) {
	t.Helper()
	rootfs = filepath.Join(e.d.Root, "containers", id, "rootfs")
	for _, m := range stateTreeMounts(t, "/proc/self/mountinfo") {
		if m.point != rootfs || m.fstype != "overlay" {
			continue
		}
		for _, o := range m.super {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return rootfs, v
			}
		}
	}
	t.Fatalf("no overlay with an upperdir at %s", rootfs)
	return "", ""
}

// stateTreeAsNobody runs busybox with args as the host user nobody and returns its
// combined output and error.
func stateTreeAsNobody(args ...string) (string, error) {
	cmd := exec.Command(testimages.BusyboxPath, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: stateTreeNobody, Gid: stateTreeNobody}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// stateTreeWantDenied fails the test unless nobody's try of path failed for want
// of permission.
func stateTreeWantDenied(t *testing.T, what, path string, out string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s %s as nobody: allowed, output %q", what, path, out)
	case errors.Is(err, fs.ErrPermission), strings.Contains(out, "Permission denied"):
	default:
		t.Errorf("%s %s as nobody: %v %q, want permission denied", what, path, err, out)
	}
}

// The reproduction of issue 34's finding 1: a container plants a setuid
// root copy of busybox in its upper dir, whose path every host user reads
// in /proc/self/mountinfo. The host user nobody can neither stat nor run
// it, there or through the merged rootfs, nor list the containers, nor
// read the image's files, nor touch the pod's /dev/shm.
func TestStateTreeSetuidFileUnreachableByHostUser(t *testing.T) {
	t.Parallel()
	e := startStateTreeEnv(t)
	e.exec(t, e.ctr, "sh", "-c", "cp /bin/busybox /tmp/y && chmod 4755 /tmp/y")
	rootfs, upper := e.upperDir(t, e.ctr)
	planted := filepath.Join(upper, "tmp", "y")
	if fi, err := os.Stat(planted); err != nil || fi.Mode()&fs.ModeSetuid == 0 {
		t.Fatalf("the container's setuid file %s: %v %v", planted, fi, err)
	}

	out, err := stateTreeAsNobody("stat", "-c", "%A %u", planted)
	stateTreeWantDenied(t, "stat", planted, out, err)
	out, err = stateTreeAsNobody("stat", "-c", "%A %u", filepath.Join(rootfs, "tmp", "y"))
	stateTreeWantDenied(t, "stat", filepath.Join(rootfs, "tmp", "y"), out, err)
	// Run it directly, as `su nobody -c <upperdir>/tmp/y` did.
	cmd := exec.Command(planted)
	cmd.Args = []string{"busybox", "true"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: stateTreeNobody, Gid: stateTreeNobody}}
	b, err := cmd.CombinedOutput()
	stateTreeWantDenied(t, "run", planted, string(b), err)

	for _, c := range []struct{ what, path string }{
		{"list", filepath.Join(e.d.Root, "containers")},
		{"list", filepath.Join(rootfs, "bin")},
		{"list", e.podShm},
		{"list", filepath.Join(e.d.Root, "sandboxes")},
	} {
		out, err := stateTreeAsNobody("ls", c.path)
		stateTreeWantDenied(t, c.what, c.path, out, err)
	}
	out, err = stateTreeAsNobody("cat", filepath.Join(rootfs, "bin", "busybox"))
	stateTreeWantDenied(t, "read", filepath.Join(rootfs, "bin", "busybox"), out[:min(len(out), 200)], err)
	out, err = stateTreeAsNobody("touch", filepath.Join(e.podShm, "x"))
	stateTreeWantDenied(t, "create in", e.podShm, out, err)
}

// stateTreeTraversable lists, of berthd's root and state dirs, the dirs a
// host user may search (never list): the container's root in a user
// namespace pod is an unprivileged host user, so the way to its rootfs
// and pod dirs must be searchable; every entry of them is closed (0700,
// or 0710 for the group of a user namespace pod's root).
func stateTreeTraversable(d *berthdtest.Daemon) []string {
	return []string{d.Root, filepath.Join(d.Root, "containers"), filepath.Join(d.Root, "sandboxes"), d.State, filepath.Join(d.State, "sandboxes")}
}

// Every path under the root and state dirs of a berthd running a pod and
// a user namespace pod, tried by nobody: each one it reaches is on the
// traversable list, a directory it cannot list.
func TestStateTreeClosedToHostUsers(t *testing.T) {
	t.Parallel()
	e := startStateTreeEnv(t)
	stateTreeWantClosed(t, e.d)
}

// A tree an older berthd left open (0711 container and pod dirs, 0711
// pins and shims dirs, 0755 CNI leases) is closed when berthd starts
// again; its running containers, the user namespace one included, go on,
// and the user namespace pod takes a new container.
func TestStateTreeOlderTreeClosedAtStart(t *testing.T) {
	t.Parallel()
	e := startStateTreeEnv(t)
	e.d.Stop()
	open := []string{
		filepath.Join(e.d.Root, "containers", e.ctr),
		filepath.Join(e.d.Root, "sandboxes", e.pod),
		filepath.Join(e.d.State, "sandboxes", e.pod),
		filepath.Join(e.d.State, "netns"),
		filepath.Join(e.d.State, "shims"),
	}
	if e.usernsCtr != "" {
		open = append(open,
			filepath.Join(e.d.Root, "containers", e.usernsCtr),
			filepath.Join(e.d.Root, "sandboxes", e.usernsPod),
			filepath.Join(e.d.State, "sandboxes", e.usernsPod))
	}
	for _, p := range open {
		if err := os.Chown(p, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{filepath.Join(e.d.Root, "cni"), filepath.Join(e.d.Root, "cni", "networks")} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.d.Start()
	e.d.WaitReady()
	stateTreeWantClosed(t, e.d)
	if got := e.exec(t, e.ctr, "echo", "on"); got != "on\n" {
		t.Fatalf("exec after restart: %q", got)
	}
	if e.usernsCtr != "" {
		if got := e.exec(t, e.usernsCtr, "cat", "/proc/self/uid_map"); !strings.Contains(got, "200000") {
			t.Fatalf("user namespace container after restart: uid_map %q", got)
		}
		opts := e.usernsOpts()
		cfg := stateTreePodConfig("statetree-userns", opts)
		cfg.LogDirectory = e.podLog
		id := e.runContainer(t, e.usernsPod, cfg, opts, "again")
		if got := e.exec(t, id, "id", "-u"); got != "0\n" {
			t.Fatalf("new user namespace container: id -u %q", got)
		}
	}
}

// stateTreeWantClosed walks d's root and state dirs as root, and fails
// for each path the host user nobody reaches beyond the traversable list,
// or can list.
func stateTreeWantClosed(t *testing.T, d *berthdtest.Daemon) {
	t.Helper()
	var paths []string
	for _, top := range []string{d.Root, d.State} {
		err := filepath.WalkDir(top, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !strings.ContainsAny(p, "\n\\") {
				paths = append(paths, p)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("walk %s: %v", top, err)
		}
	}
	reached := stateTreeReachable(t, paths)
	t.Logf("nobody tried %d paths, reached %d", len(paths), len(reached))
	traversable := stateTreeTraversable(d)
	for _, r := range reached {
		switch {
		case slices.Contains(traversable, r.path) && !r.r && !r.w:
			// Searched through, never listed or written.
		case slices.Contains(traversable, filepath.Dir(r.path)) && !r.r && !r.w && !r.x:
			// An entry of one, named by an ID nobody may know: its lstat
			// works, nothing else does.
		default:
			fi, _ := os.Lstat(r.path)
			t.Errorf("nobody reaches %s (mode %v owner %v): read %v, write %v, search %v", r.path, fi.Mode(), stateTreeOwner(fi), r.r, r.w, r.x)
		}
	}
}

type stateTreeReach struct {
	path    string
	r, w, x bool // what nobody may do: read (list), write, search (run)
}

// stateTreeReachable is the paths nobody can lstat, and what it may do
// with them: one busybox shell tries them all.
func stateTreeReachable(t *testing.T, paths []string) []stateTreeReach {
	t.Helper()
	cmd := exec.Command(testimages.BusyboxPath, "sh", "-c", `while IFS= read -r p; do
	if [ -e "$p" ] || [ -L "$p" ]; then
		m=; [ -r "$p" ] && m=${m}r; [ -w "$p" ] && m=${m}w; [ -x "$p" ] && m=${m}x
		echo "${m:--} $p"
	fi
done`)
	cmd.Dir = "/"
	cmd.Stdin = strings.NewReader(strings.Join(paths, "\n") + "\n")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: stateTreeNobody, Gid: stateTreeNobody}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nobody's walk: %v %s", err, stderr.String())
	}
	var reached []stateTreeReach
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		mode, p, _ := strings.Cut(sc.Text(), " ")
		reached = append(reached, stateTreeReach{path: p, r: strings.Contains(mode, "r"), w: strings.Contains(mode, "w"), x: strings.Contains(mode, "x")})
	}
	return reached
}

func stateTreeOwner(fi fs.FileInfo) string {
	if fi == nil {
		return "?"
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "?"
	}
	return strconv.Itoa(int(st.Uid)) + ":" + strconv.Itoa(int(st.Gid))
}

// The pod's /dev/shm serves no setuid, device or program: its tmpfs is
// mounted nosuid,nodev,noexec on the host, the container sees it so too,
// and its mode stays 1777 inside (in a user namespace pod as well).
func TestStateTreePodShmNosuidNodevNoexec(t *testing.T) {
	t.Parallel()
	e := startStateTreeEnv(t)
	want := []string{"nosuid", "nodev", "noexec"}
	hasAll := func(opts []string) bool {
		for _, w := range want {
			if !slices.Contains(opts, w) {
				return false
			}
		}
		return true
	}
	for _, c := range []struct{ ctr, shm string }{{e.ctr, e.podShm}, {e.usernsCtr, e.usernsPodShm}} {
		if c.ctr == "" {
			continue
		}
		found := false
		for _, m := range stateTreeMounts(t, "/proc/self/mountinfo") {
			if m.point == c.shm {
				found = true
				if m.fstype != "tmpfs" || !hasAll(m.opts) {
					t.Errorf("host mount of %s: %s %v, want tmpfs with %v", c.shm, m.fstype, m.opts, want)
				}
			}
		}
		if !found {
			t.Errorf("the pod's /dev/shm %s is not mounted", c.shm)
		}
		found = false
		for line := range strings.Lines(e.exec(t, c.ctr, "cat", "/proc/self/mountinfo")) {
			f := strings.Fields(line)
			if len(f) < 6 || f[4] != "/dev/shm" {
				continue
			}
			found = true
			if opts := strings.Split(f[5], ","); !hasAll(opts) {
				t.Errorf("container %s: /dev/shm mounted %v, want %v", c.ctr, opts, want)
			}
		}
		if !found {
			t.Errorf("container %s has no /dev/shm mount", c.ctr)
		}
		if got := e.exec(t, c.ctr, "stat", "-c", "%a", "/dev/shm"); got != "1777\n" {
			t.Errorf("container %s: /dev/shm mode %q, want 1777", c.ctr, got)
		}
	}
}

// `berthctl image export` writes the archive (every file of the image)
// 0600 whatever the umask, and follows no name planted beside it.
func TestStateTreeImageExportIsPrivate(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	ref := reg.Ref(testimages.BusyboxRef)
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	ctl := filepath.Join(os.Getenv("BERTH_BIN_DIR"), "berthctl")
	if os.Getenv("BERTH_BIN_DIR") == "" {
		var err error
		if ctl, err = berthdtest.BuildCommand(t.TempDir(), "berthctl"); err != nil {
			t.Fatalf("build berthctl: %v", err)
		}
	}
	export := func(archive string) {
		t.Helper()
		cmd := exec.Command("/bin/sh", "-c", `umask 022 && exec "$0" "$@"`, ctl, "image", "export", ref, archive)
		cmd.Env = append(os.Environ(), "BERTH_ADDRESS=unix://"+d.Socket)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("berthctl image export: %v\n%s", err, out)
		}
	}
	dir := t.TempDir()
	archive := filepath.Join(dir, "export.tar")
	export(archive)
	if fi, err := os.Lstat(archive); err != nil || fi.Mode() != 0o600 {
		t.Errorf("exported archive: %v %v, want a plain file 0600", fi.Mode(), err)
	}

	// The old scratch name, planted as a symlink to a file of root's.
	planted := filepath.Join(dir, "planted.tar")
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, planted+".partial"); err != nil {
		t.Fatal(err)
	}
	export(planted)
	if b, _ := os.ReadFile(victim); string(b) != "root's\n" {
		t.Errorf("export wrote through the planted %s.partial symlink: the victim now holds %d bytes", planted, len(b))
	}
	if fi, err := os.Lstat(planted); err != nil || fi.Mode() != 0o600 {
		t.Errorf("exported archive beside a planted name: %v %v, want a plain file 0600", fi.Mode(), err)
	}
}
