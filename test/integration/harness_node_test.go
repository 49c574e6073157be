package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// berthctl's binary: BERTH_BIN_DIR's, or built once for the package.
var (
	berthctlOnce sync.Once
	berthctlPath string
	berthctlErr  error
)

// berthctl is $BERTH_BIN_DIR/berthctl (make test) or one built from this
// checkout.
func berthctl(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("BERTH_BIN_DIR"); dir != "" {
		return filepath.Join(dir, "berthctl")
	}
	berthctlOnce.Do(func() {
		dir, err := os.MkdirTemp("", "berthctl-bin-")
		if err != nil {
			berthctlErr = err
			return
		}
		berthctlPath, berthctlErr = berthdtest.BuildCommand(dir, "berthctl")
	})
	if berthctlErr != nil {
		t.Fatalf("build berthctl: %v", berthctlErr)
	}
	return berthctlPath
}

// runCtl runs berthctl against d and returns its combined output.
func runCtl(t *testing.T, d *berthdtest.Daemon, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(berthctl(t), args...)
	cmd.Env = append(os.Environ(), "BERTH_ADDRESS=unix://"+d.Socket)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// runBerthctl runs berthctl with args and returns its combined output
// and exit code.
func runBerthctl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(berthctl(t), args...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run berthctl: %v", err)
	}
	return string(out), code
}

// cgroupV2 reports whether the node runs the unified hierarchy alone.
func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// cgroupHierarchyRoots lists the mounted hierarchies: the unified root on
// v2, every v1 hierarchy (and the unified one of hybrid) otherwise.
func cgroupHierarchyRoots() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue // cpu -> cpu,cpuacct style links
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// cgroupDirs lists path in every mounted hierarchy where it exists.
func cgroupDirs(path string) []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	var out []string
	for _, r := range roots {
		if fi, err := os.Stat(filepath.Join(r, path)); err == nil && fi.IsDir() {
			out = append(out, filepath.Join(r, path))
		}
	}
	return out
}

// cgroupDir is group's directory for controller: in that controller's v1
// hierarchy, or in the unified hierarchy on v2 (the guest lane,
// docs/decisions/2200-cgroup-v2-guest-lane.md).
func cgroupDir(controller, group string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", group)
	}
	return filepath.Join("/sys/fs/cgroup", controller, group)
}

// memoryCgroupDir is group's directory in the memory hierarchy (v1) or
// the unified one (v2).
func memoryCgroupDir(group string) string { return cgroupDir("memory", group) }

// readCgroupFile is file of group in hierarchy ("" on v2), trimmed.
func readCgroupFile(t *testing.T, hierarchy, group, file string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", hierarchy, group, file))
	if err != nil {
		t.Fatalf("read %s of %s: %v", file, group, err)
	}
	return strings.TrimSpace(string(data))
}

// procCgroup is the cgroup of the process at proc (/proc/<pid>): the
// unified one on v2; on v1 the one in hierarchy (a controller, or
// "name=systemd").
func procCgroup(t *testing.T, proc, hierarchy string) string {
	t.Helper()
	data, err := os.ReadFile(proc + "/cgroup")
	if err != nil {
		t.Fatalf("cgroup of %s: %v", proc, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if cgroupV2() && parts[0] == "0" && parts[1] == "" {
			return parts[2]
		}
		if !cgroupV2() && slices.Contains(strings.Split(parts[1], ","), hierarchy) {
			return parts[2]
		}
	}
	t.Fatalf("no %s cgroup for %s in\n%s", hierarchy, proc, data)
	return ""
}

// hostProc is /proc/<pid> for berthd's pids on the host's PID namespace.
func hostProc(pid int) string { return fmt.Sprintf("/proc/%d", pid) }

// cgroupOf is pid's cgroup in controller's v1 hierarchy, or its unified
// cgroup on v2.
func cgroupOf(t *testing.T, pid int, controller string) string {
	t.Helper()
	return procCgroup(t, hostProc(pid), controller)
}

// memoryLimitOf reads the memory limit of pid's cgroup (memory.max on v2,
// memory.limit_in_bytes on v1).
func memoryLimitOf(t *testing.T, pid int) (string, error) {
	t.Helper()
	file := "memory.limit_in_bytes"
	if cgroupV2() {
		file = "memory.max"
	}
	data, err := os.ReadFile(filepath.Join(memoryCgroupDir(cgroupOf(t, pid, "memory")), file))
	return strings.TrimSpace(string(data)), err
}

// removeCgroupTree removes root and the cgroups below it in every
// hierarchy, deepest first, retrying a busy one a while.
func removeCgroupTree(t *testing.T, root string) {
	for _, top := range cgroupDirs(root) {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for try := 0; try < 50; try++ {
				if err := unix.Rmdir(dirs[i]); err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if _, err := os.Stat(top); err == nil {
			t.Logf("cgroup %s left behind", top)
		}
	}
}

// privateSystemd is a systemd running as PID 1 of its own PID and mount
// namespaces ("systemd in a container"), with a private /run and its
// cgroup root at Root (a cgroup of its own in the host's hierarchies). On
// a node booted with systemd, the node's own systemd is used instead.
type privateSystemd struct {
	Pid  int    // systemd's pid in the host's PID namespace; 0: the host's systemd
	Root string // systemd's cgroup root below the hierarchy roots ("/" for the host's)
}

// systemdBinary is the systemd a private systemd runs.
const systemdBinary = "/lib/systemd/systemd"

// startPrivateSystemd boots a private systemd, or skips the test (saying
// why) where that cannot be done.
func startPrivateSystemd(t *testing.T) *privateSystemd {
	t.Helper()
	berthdtest.RequireRoot(t)
	if fi, err := os.Stat("/run/systemd/system"); err == nil && fi.IsDir() {
		return &privateSystemd{Root: "/"}
	}
	for _, bin := range []string{systemdBinary, "/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/systemctl"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("systemd is not running and %s is missing: cannot start a private systemd", bin)
		}
	}
	// systemd's root: a fresh cgroup, the same in every hierarchy (systemd
	// manages a v1 controller only where its name=systemd root exists in
	// that hierarchy too), so that all it makes goes away with it.
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil {
		if _, err := os.Stat("/sys/fs/cgroup/systemd/cgroup.procs"); err != nil {
			t.Skip("cgroup v1 without a name=systemd hierarchy: a private systemd cannot track units")
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	root := "/berthsd" + hex.EncodeToString(b)
	sd := &privateSystemd{Root: root}
	t.Cleanup(func() { removeCgroupTree(t, root) })
	var join strings.Builder
	for _, h := range cgroupHierarchyRoots() {
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("create systemd's cgroup root: %v", err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, _ := os.ReadFile(filepath.Join(h, f))
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					t.Fatalf("fill %s: %v", f, err)
				}
			}
		}
		fmt.Fprintf(&join, "echo $$ > %s/cgroup.procs && ", dir)
	}

	// Inside: a private /run holding only a target with no dependencies,
	// so systemd starts nothing of the node's own units.
	boot := `mount --make-rprivate / && mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && ` +
		`printf '[Unit]\nDescription=berth test\nDefaultDependencies=no\n' > /run/systemd/system/berth-test.target && ` +
		`exec env container=berth ` + systemdBinary + ` --unit=berth-test.target --log-target=console`
	var logs bytes.Buffer
	cmd := exec.Command("/bin/sh", "-c", join.String()+"exec unshare --pid --mount --fork --mount-proc /bin/sh -c \""+boot+"\"")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skipf("start a private systemd: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		if sd.Pid > 0 {
			// SIGKILL to a PID namespace's init ends every process in it,
			// and with them the namespace's mounts.
			_ = unix.Kill(sd.Pid, unix.SIGKILL)
		}
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		<-done
	})

	deadline := time.Now().Add(30 * time.Second)
	for ; ; time.Sleep(100 * time.Millisecond) {
		select {
		case <-done:
			t.Skipf("a private systemd could not be started here; output:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Skipf("a private systemd did not come up in 30s; output:\n%s", logs.String())
		}
		if sd.Pid == 0 {
			children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
			if f := strings.Fields(string(children)); len(f) > 0 {
				sd.Pid, _ = strconv.Atoi(f[0])
			}
			continue
		}
		if out, err := sd.systemctl("is-system-running"); err == nil || strings.Contains(out, "degraded") {
			return sd
		}
	}
}

// systemctl runs systemctl against this systemd.
func (sd *privateSystemd) systemctl(args ...string) (string, error) {
	var cmd *exec.Cmd
	if sd.Pid == 0 {
		cmd = exec.Command("systemctl", args...)
	} else {
		cmd = exec.Command("nsenter", append([]string{"-t", strconv.Itoa(sd.Pid), "-m", "-p", "--", "systemctl"}, args...)...)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// startProcess starts berthd in systemd's PID and mount namespaces: the
// PID namespace by setns on a locked thread that forks berthd (and is then
// thrown away), the mount namespace by nsenter, which execs berthd without
// forking, so signals reach berthd itself.
func (sd *privateSystemd) startProcess(cmd *exec.Cmd) error {
	if sd.Pid == 0 {
		return cmd.Start()
	}
	cmd.Args = append([]string{"nsenter", "--mount=/proc/" + strconv.Itoa(sd.Pid) + "/ns/mnt", "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/usr/bin/nsenter"
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		fd, err := unix.Open("/proc/"+strconv.Itoa(sd.Pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWPID); err != nil {
			errc <- fmt.Errorf("enter systemd's PID namespace: %w", err)
			return
		}
		errc <- cmd.Start()
	}()
	return <-errc
}

// unitsOf lists the loaded units matching pattern.
func (sd *privateSystemd) unitsOf(t *testing.T, pattern string) []string {
	t.Helper()
	return sd.units(t, pattern)
}

// cgroupUnitsOf lists the loaded slices and scopes whose name holds id
// (systemd also mirrors berth's mounts as .mount units; those are not
// berth's to remove).
func (sd *privateSystemd) cgroupUnitsOf(t *testing.T, id string) []string {
	t.Helper()
	return sd.units(t, "*"+id+"*.slice", "*"+id+"*.scope")
}

// units lists the loaded units matching any of patterns.
func (sd *privateSystemd) units(t *testing.T, patterns ...string) []string {
	t.Helper()
	out, err := sd.systemctl(append([]string{"list-units", "--all", "--plain", "--no-legend"}, patterns...)...)
	if err != nil {
		t.Fatalf("systemctl list-units: %v: %s", err, out)
	}
	var units []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units
}
