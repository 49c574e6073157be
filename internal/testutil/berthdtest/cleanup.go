package berthdtest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/testutil/mounttest"
)

// CleanupNode removes everything a test daemon rooted at dir may have left:
// processes in its cgroup parent or naming dir on their command line, mounts
// below dir, its cgroups, and dir itself. Tests that check for leaks do so
// before this runs; this only keeps one test's debris from the next.
func CleanupNode(dir, cgroupParent string) error {
	var errs []error
	killProcesses(dir, cgroupParent)
	if err := UnmountBelow(dir); err != nil {
		errs = append(errs, err)
	}
	if cgroupParent != "" {
		if err := removeCgroups(cgroupParent); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// cgroupDirs lists every directory named parent directly under a cgroup
// hierarchy root, for v1 controllers and the v2 unified tree. A parent
// that names no cgroup below a root ("", "/", "..") lists nothing: it
// would name the roots themselves, and killProcesses would kill every
// process on the machine (it did, once, from a test that had no cgroup).
func cgroupDirs(parent string) []string {
	if c := filepath.Clean("/" + parent); c == "/" || c != "/"+strings.Trim(parent, "/") {
		return nil
	}
	var dirs []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		p := filepath.Join(r, parent)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			dirs = append(dirs, p)
		}
	}
	return dirs
}

func killProcesses(dir, cgroupParent string) {
	for attempt := 0; attempt < 50; attempt++ {
		pids := map[int]bool{}
		for _, cg := range cgroupDirs(cgroupParent) {
			_ = filepath.WalkDir(cg, func(p string, e fs.DirEntry, err error) error {
				if err == nil && !e.IsDir() && e.Name() == "cgroup.procs" {
					for _, pid := range readPids(p) {
						pids[pid] = true
					}
				}
				return nil
			})
		}
		for _, pid := range PidsMentioning(dir) {
			pids[pid] = true
		}
		delete(pids, os.Getpid())
		if len(pids) == 0 {
			return
		}
		for pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readPids(path string) []int {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// PidsMentioning lists live processes whose command line contains s.
func PidsMentioning(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		if strings.Contains(string(cmdline), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ShimPids lists the berth-shim processes of one mode ("keeper" or
// "monitor") serving the daemon whose state dir is state.
func ShimPids(state, mode string) []int {
	var pids []int
	for _, pid := range PidsMentioning(state) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.TrimSpace(string(comm)) == "berth-shim" && strings.Contains(string(cmd), "\x00"+mode+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// MountsBelow lists mount points at or below dir, deepest first.
func MountsBelow(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := mounttest.Unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts, sc.Err()
}

// UnmountBelow detaches every mount at or below dir.
func UnmountBelow(dir string) error {
	var errs []error
	for attempt := 0; attempt < 5; attempt++ {
		mounts, err := MountsBelow(dir)
		if err != nil {
			return fmt.Errorf("read mountinfo: %w", err)
		}
		if len(mounts) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

func removeCgroups(parent string) error {
	var errs []error
	for _, cg := range cgroupDirs(parent) {
		var dirs []string
		_ = filepath.WalkDir(cg, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			if err := rmdirCgroup(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// rmdirCgroup removes cgroup directory d, retrying for a second while the
// kernel still counts exiting tasks in it; one already gone is fine.
func rmdirCgroup(d string) error {
	var err error
	for range 20 {
		if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", d, err)
}
