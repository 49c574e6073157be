package berthdtest

import (
	"errors"
	"io/fs"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// privateCgroupRoot is run by sh inside berthd's own mount namespace
// (slave: nothing mounted there reaches the node): it puts a fresh tmpfs
// on /sys/fs/cgroup holding bind mounts of the node's hierarchies plus a
// hugetlb hierarchy, then execs berthd. runc's v1 manager only uses
// hierarchies mounted below /sys/fs/cgroup, and a directory made on the
// node's /sys/fs/cgroup would be seen by every other daemon there.
const privateCgroupRoot = `set -e
o="$0"
mount --rbind /sys/fs/cgroup "$o"
mount -t tmpfs -o mode=755 berth-test-cgroup /sys/fs/cgroup
for p in "$o"/*; do
	n=${p##*/}
	if [ -L "$p" ]; then ln -s "$(readlink "$p")" "/sys/fs/cgroup/$n"; continue; fi
	mkdir "/sys/fs/cgroup/$n"
	mount --bind "$p" "/sys/fs/cgroup/$n"
done
mkdir -p /sys/fs/cgroup/hugetlb
mount -t cgroup -o hugetlb berth-test-hugetlb /sys/fs/cgroup/hugetlb
umount -l "$o"
exec "$@"`

// CanMountHugetlb says whether a cgroup v1 hugetlb hierarchy can be
// mounted here (in a throwaway mount namespace), with why not.
func CanMountHugetlb() (bool, string) {
	if _, err := exec.LookPath("unshare"); err != nil {
		return false, "unshare not found"
	}
	probe := exec.Command("unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
		`mount -t tmpfs tmpfs /mnt && mkdir /mnt/h && mount -t cgroup -o hugetlb berth-test-hugetlb /mnt/h`)
	if out, err := probe.CombinedOutput(); err != nil {
		return false, err.Error() + ": " + string(out)
	}
	return true, ""
}

// StartWithPrivateHugetlb is an Options.StartProcess that runs berthd in
// a mount namespace of its own whose /sys/fs/cgroup holds the node's
// hierarchies and a hugetlb one (the node and other daemons keep
// theirs); scratch is an empty directory for the script to use. unshare
// and sh exec, so the pid stays berthd's and signals reach it. Processes
// that must see the same cgroups (a kubelet) join that namespace through
// /proc/<berthd pid>/ns/mnt. The hierarchy outlives the namespace while
// it holds cgroups: remove the test's from it before berthd goes.
func StartWithPrivateHugetlb(scratch string) func(cmd *exec.Cmd) error {
	return func(cmd *exec.Cmd) error {
		args := append([]string{"--mount", "--propagation", "slave", "--", "/bin/sh", "-c", privateCgroupRoot, scratch, cmd.Path}, cmd.Args[1:]...)
		cmd.Path, cmd.Args = "/usr/bin/unshare", append([]string{"unshare"}, args...)
		return cmd.Start()
	}
}

// RemoveCgroupTree kills the processes in the cgroup dir and below it,
// then removes those cgroups, deepest first. For hierarchies the node's
// cleanup cannot see (one mounted in a private namespace, reached through
// /proc/PID/root), which must be emptied before that namespace goes.
func RemoveCgroupTree(dir string) error {
	list := func() []string {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		return dirs
	}
	for attempt := 0; attempt < 50; attempt++ {
		pids := 0
		for _, d := range list() {
			for _, pid := range readPids(filepath.Join(d, "cgroup.procs")) {
				_ = unix.Kill(pid, unix.SIGKILL)
				pids++
			}
		}
		if pids == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, d := range list() {
		if err := rmdirCgroup(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
