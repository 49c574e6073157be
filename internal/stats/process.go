package stats

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ProcessCounts counts the threads, open file descriptors and sockets of
// pids (a cgroup's processes) in procRoot (normally /proc), as cAdvisor
// does. A process that exits while it is counted is skipped: a container's
// processes come and go.
func ProcessCounts(procRoot string, pids []int) (threads, fds, sockets uint64) {
	for _, pid := range pids {
		dir := filepath.Join(procRoot, strconv.Itoa(pid))
		if tasks, err := os.ReadDir(filepath.Join(dir, "task")); err == nil {
			threads += uint64(len(tasks))
		}
		entries, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue
		}
		fds += uint64(len(entries))
		for _, e := range entries {
			if target, err := os.Readlink(filepath.Join(dir, "fd", e.Name())); err == nil && strings.HasPrefix(target, "socket:") {
				sockets++
			}
		}
	}
	return threads, fds, sockets
}

// statKey reads one "key value" line of a flat-keyed cgroup file such as
// memory.stat.
func statKey(path, key string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// blockDevice names a block device by its numbers: /dev/<name> from
// sysfs, or "major:minor" when the device is unknown here.
func blockDevice(major, minor uint64) string {
	num := fmt.Sprintf("%d:%d", major, minor)
	if target, err := os.Readlink(filepath.Join("/sys/dev/block", num)); err == nil {
		return "/dev/" + filepath.Base(target)
	}
	return num
}

// FsCapacity is the size and inode counts of the filesystem holding dir
// (a container's writable layer), from statfs.
type FsCapacity struct {
	LimitBytes, Inodes, InodesFree uint64
}

// Capacity statfs-es the filesystem that holds dir.
func Capacity(dir string) (FsCapacity, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return FsCapacity{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return FsCapacity{LimitBytes: st.Blocks * uint64(st.Bsize), Inodes: st.Files, InodesFree: st.Ffree}, nil
}
