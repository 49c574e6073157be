// Command berth-pause holds a pod's shared PID namespace: berthd starts it
// as pid 1 of a new PID namespace only for pods that ask for one. berthd
// also starts it in a new user namespace to create a user namespace pod's
// namespaces, and kills it once they are pinned (unless it is also that
// pod's PID namespace holder). It
// sleeps, reaps orphaned children (it is their init) and exits on SIGTERM
// or SIGINT. Its one argument, the pod's state directory, is only there to
// make the process easy to attribute.
//
// Being pid 1 of the pod's containers, it is what their /proc/1/root,
// /proc/1/cwd, /proc/1/environ and /proc/1/fd lead to, and a container
// granted CAP_SYS_PTRACE passes the kernel's access check on it. So
// before it reports ready it gives up everything a container could
// borrow, as containerd's pause image does (uid 65535 in a root file
// system of its own): see harden. berthd starts it in a new mount
// namespace with an empty environment and reads "ok" from its stdout, or
// the reason it could not harden itself; then stdout and stderr become
// /dev/null.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// holderID is the uid and gid the holder runs as: the pause image's
// (65535), an ID no host account uses.
const holderID = 65535

func main() {
	// Before anything opens a file: drop what the parent left open (a user
	// namespace's holder is executed through /proc/self/fd/3).
	closeExtraFDs()
	// Started through /proc/self/fd/N (a user namespace pod's holder), the
	// kernel names the process "N": name it for ps and pgrep.
	_ = writeFile("/proc/self/comm", "berth-pause")
	if err := harden(); err != nil {
		_, _ = unix.Write(2, []byte("berth-pause: "+err.Error()+"\n"))
		os.Exit(1)
	}
	// Tell berthd, then leave its pipe: stdout and stderr become stdin's
	// /dev/null, so berthd reads end of file.
	_, _ = unix.Write(1, []byte("ok\n"))
	_ = unix.Dup2(0, 1)
	_ = unix.Dup2(0, 2)

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// closeExtraFDs closes every descriptor but stdin, stdout and stderr.
func closeExtraFDs() {
	if err := unix.CloseRange(3, ^uint(0), 0); err == nil {
		return
	}
	// Kernels before 5.9 (nothing else is open yet: the highest is the
	// soft limit on descriptors, below 4096 unless raised).
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<20 {
		lim.Cur = 1 << 20
	}
	for fd := 3; fd < int(lim.Cur); fd++ {
		_ = unix.Close(fd)
	}
}

// readFile and writeFile use plain system calls: an *os.File would start
// the Go runtime's network poller (two more descriptors in pid 1 of the
// pod) and its descriptors would outlive closeExtraFDs' view.
func readFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 4096)
	for len(buf) < cap(buf) {
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			break
		}
		buf = buf[:len(buf)+n]
	}
	return buf, nil
}

func writeFile(path, data string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(data))
	return err
}

// harden leaves the holder nothing a container of its pod could reach
// through /proc/1 or borrow from it:
//   - its root and working directory are an empty read-only tmpfs, the
//     only mount of its own mount namespace (pivot_root, old root
//     detached), so /proc/1/root shows nothing of the host;
//   - it runs as uid and gid 65535 (in a user namespace pod, when the
//     mapping holds that ID; else its highest mapped ID) with no
//     supplementary groups;
//   - it holds no capability in any set, bounding included, and has
//     no_new_privs, so nothing it could exec would give one back;
//   - it is not dumpable: ptrace and /proc/1/mem need CAP_SYS_PTRACE
//     over its user namespace even for a process of the same uid.
//
// Its environment is empty because berthd starts it so.
func harden() error {
	if err := checkOwnMountNamespace(); err != nil {
		return err
	}
	uid, err := idToUse("/proc/self/uid_map")
	if err != nil {
		return err
	}
	gid, err := idToUse("/proc/self/gid_map")
	if err != nil {
		return err
	}
	lastCap, err := readLastCap()
	if err != nil {
		return err
	}
	if err := pivotToEmptyRoot(); err != nil {
		return err
	}
	for c := 0; c <= lastCap; c++ {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	// The runtime applies these to every thread.
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("clear supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("set gid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("set uid %d: %w", uid, err)
	}
	// Leaving uid 0 cleared the permitted, effective and ambient sets;
	// clear inheritable too (and all of them where uid 0 had to stay).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("clear capabilities: %w", err)
	}
	// After the uid change, which may reset it.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the holder non-dumpable: %w", err)
	}
	return nil
}

// checkOwnMountNamespace refuses to go on in its parent's mount namespace:
// pivot_root there would move berthd's root (and that of every process
// sharing it). berthd starts the holder with CLONE_NEWNS; this guards
// against any other start. A holder in a user namespace cannot read its
// parent's namespace, and cannot pivot a mount namespace it does not own
// either (EPERM), so that case is safe by itself.
func checkOwnMountNamespace() error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("read own mount namespace: %w", err)
	}
	// /proc is the host's: its stat names the parent by its host pid
	// (getppid is 0 for pid 1 of a new PID namespace).
	stat, err := readFile("/proc/self/stat")
	if err != nil {
		return fmt.Errorf("read own stat: %w", err)
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return fmt.Errorf("parse own stat %q", stat)
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return fmt.Errorf("parse own stat %q", stat)
	}
	parent, err := os.Readlink("/proc/" + fields[1] + "/ns/mnt")
	switch {
	case errors.Is(err, fs.ErrPermission):
		return nil
	case err != nil:
		return fmt.Errorf("read parent's mount namespace: %w", err)
	case parent == self:
		return errors.New("started in its parent's mount namespace (berthd starts it with CLONE_NEWNS): refusing to pivot that one")
	}
	return nil
}

// idToUse returns holderID if the user namespace maps it, else the highest
// ID it maps (0 for a mapping of root alone).
func idToUse(mapFile string) (int, error) {
	b, err := readFile(mapFile)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", mapFile, err)
	}
	highest := -1
	for _, line := range strings.Split(string(b), "\n") {
		var inside, outside, size uint64
		if _, err := fmt.Sscan(line, &inside, &outside, &size); err != nil || size == 0 {
			continue
		}
		if inside <= holderID && holderID < inside+size {
			return holderID, nil
		}
		if top := inside + size - 1; top < 1<<31 && int(top) > highest {
			highest = int(top)
		}
	}
	if highest < 0 {
		return 0, fmt.Errorf("%s maps no ID", mapFile)
	}
	return highest, nil
}

func readLastCap() (int, error) {
	b, err := readFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read the last capability: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 0, fmt.Errorf("parse the last capability %q", b)
	}
	return n, nil
}

// pivotToEmptyRoot mounts an empty read-only tmpfs (over /proc, which
// every node has; in this mount namespace only) and makes it the root:
// pivot_root(".", ".") stacks the old root on it, and the lazy unmount
// drops the old root and every mount below it from this namespace.
func pivotToEmptyRoot() error {
	const dir = "/proc"
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0555,size=4k"); err != nil {
		return fmt.Errorf("mount an empty tmpfs for the root: %w", err)
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("enter the new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root to an empty tmpfs: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("enter /: %w", err)
	}
	return nil
}

// allThreads runs a per-thread system call on every thread of the
// process (prctl and capset act on the calling thread only).
func allThreads(trap, a1, a2, a3 uintptr) error {
	if _, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3); errno != 0 {
		return errno
	}
	return nil
}
