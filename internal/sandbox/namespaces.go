package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/sysctl"
	"github.com/berthcri/berth/internal/userns"
)

// nsRequest says which namespaces a pod gets and what to set inside them.
type nsRequest struct {
	netPin, ipcPin, utsPin string // "" = use the host's
	hostname               string
	sysctls                map[string]string // already validated
	pause                  *pauseRequest     // nil unless pid NamespaceMode_POD
	// userns, when set, puts the pod in a new user namespace that owns
	// its other namespaces, pinned at userPin; holder starts it.
	userns  *userns.Mapping
	userPin string
	holder  *pauseRequest
}

type pauseRequest struct {
	binary string
	arg    string // its state dir: makes the process findable by path
}

// createNamespaces unshares the requested namespaces on a dedicated OS
// thread, configures them (hostname, lo up, sysctls), pins each by bind
// mounting /proc/thread-self/ns/<kind> onto a file and, for a shared PID
// namespace, forks the pause holder from the same thread so it inherits
// them. The thread is never unlocked: it exits with its goroutine, so no
// Go code ever runs in the pod's namespaces afterwards.
//
// It returns the pause process's pid (0 when none). Pins made before a
// failure are left for the caller's teardown, which removes pins by path.
func createNamespaces(req nsRequest) (int, error) {
	if req.userns != nil {
		return createInUserns(req)
	}
	type result struct {
		pid int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		pid, err := setupOnThread(req)
		done <- result{pid, err}
	}()
	r := <-done
	return r.pid, r.err
}

func setupOnThread(req nsRequest) (int, error) {
	var flags int
	if req.netPin != "" {
		flags |= unix.CLONE_NEWNET
	}
	if req.utsPin != "" {
		flags |= unix.CLONE_NEWUTS
	}
	if req.ipcPin != "" {
		flags |= unix.CLONE_NEWIPC
	}
	if flags != 0 {
		if err := unix.Unshare(flags); err != nil {
			return 0, fmt.Errorf("unshare namespaces: %w", err)
		}
	}
	if req.utsPin != "" && req.hostname != "" {
		if err := unix.Sethostname([]byte(req.hostname)); err != nil {
			return 0, fmt.Errorf("set hostname %q: %w", req.hostname, err)
		}
	}
	if req.netPin != "" {
		if err := loopbackUp(); err != nil {
			return 0, err
		}
	}
	if err := writeSysctls(req.sysctls); err != nil {
		return 0, err
	}
	tid := strconv.Itoa(unix.Gettid())
	for _, p := range []struct{ kind, pin string }{{"net", req.netPin}, {"ipc", req.ipcPin}, {"uts", req.utsPin}} {
		if p.pin == "" {
			continue
		}
		if err := pin("/proc/self/task/"+tid+"/ns/"+p.kind, p.pin); err != nil {
			return 0, err
		}
	}
	if req.pause == nil {
		return 0, nil
	}
	cmd := exec.Command(req.pause.binary, req.pause.arg)
	// Forked from this thread, the child inherits the pod's net/ipc/uts;
	// CLONE_NEWPID makes it pid 1 of the pod's PID namespace. Its own
	// process group keeps signals to berthd's group away from it.
	// StartPause adds its own mount namespace and an empty environment,
	// and waits until it has dropped every privilege.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID, Setpgid: true}
	if err := userns.StartPause(cmd); err != nil {
		return 0, fmt.Errorf("start pause %s: %w", req.pause.binary, err)
	}
	pid := cmd.Process.Pid
	// Reap it when it exits while this daemon is its parent.
	go func() { _ = cmd.Wait() }()
	return pid, nil
}

// writeSysctls sets the pod's sysctls (keys in sysctl.Key's form). /proc/sys/net and the IPC sysctls
// resolve against the calling thread's namespaces, which must be the
// pod's.
func writeSysctls(sysctls map[string]string) error {
	for key, val := range sysctls {
		path := "/proc/sys/" + sysctl.Path(key)
		if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
			return fmt.Errorf("set sysctl %s=%s: %w", key, val, err)
		}
	}
	return nil
}

// createInUserns creates the pod's user namespace together with its
// network, IPC and UTS (and, for a shared PID namespace, PID) namespaces
// in one clone of the holder, so the user namespace owns them all: the
// kernel lets a container mount sysfs, mqueue and /proc only over
// namespaces its user namespace owns. A thread cannot unshare a user
// namespace in a multithreaded process, hence the child. berthd pins each
// namespace from /proc/<holder>/ns, then configures them (hostname, lo,
// sysctls) from a locked thread that joins them: host root is privileged
// over every user namespace below its own. The holder stays as the pod's
// pause process when a shared PID namespace was asked for; otherwise it
// is killed once the pins hold the namespaces.
//
// It returns the pause pid (0 when none); pins made before a failure are
// left for the caller's teardown, as in createNamespaces.
func createInUserns(req nsRequest) (int, error) {
	var flags uintptr
	for _, p := range []struct {
		pin  string
		flag uintptr
	}{{req.netPin, unix.CLONE_NEWNET}, {req.ipcPin, unix.CLONE_NEWIPC}, {req.utsPin, unix.CLONE_NEWUTS}} {
		if p.pin != "" {
			flags |= p.flag
		}
	}
	holder := req.holder
	if req.pause != nil {
		flags |= unix.CLONE_NEWPID
		holder = req.pause
	}
	cmd, err := userns.StartHolder(*req.userns, userns.HolderOptions{Binary: holder.binary, Arg: holder.arg, Cloneflags: flags})
	if err != nil {
		return 0, err
	}
	pid := cmd.Process.Pid
	if req.pause != nil {
		// Kept as the pause process: reaped when it exits while this
		// daemon is its parent; the caller's teardown stops it.
		go func() { _ = cmd.Wait() }()
	} else {
		defer userns.StopHolder(cmd)
		pid = 0
	}
	nsDir := fmt.Sprintf("/proc/%d/ns/", cmd.Process.Pid)
	for _, p := range []struct{ kind, pin string }{{"user", req.userPin}, {"net", req.netPin}, {"ipc", req.ipcPin}, {"uts", req.utsPin}} {
		if p.pin == "" {
			continue
		}
		if err := pin(nsDir+p.kind, p.pin); err != nil {
			return pid, err
		}
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, now in the pod's namespaces, exits
		// with this goroutine.
		runtime.LockOSThread()
		done <- configureJoined(req)
	}()
	return pid, <-done
}

// configureJoined joins the pod's pinned namespaces on the current (locked)
// thread and sets the hostname, brings lo up and writes the sysctls.
func configureJoined(req nsRequest) error {
	for _, p := range []struct {
		pin  string
		kind int
	}{{req.utsPin, unix.CLONE_NEWUTS}, {req.netPin, unix.CLONE_NEWNET}, {req.ipcPin, unix.CLONE_NEWIPC}} {
		if p.pin == "" {
			continue
		}
		f, err := os.Open(p.pin)
		if err != nil {
			return fmt.Errorf("open namespace pin: %w", err)
		}
		err = unix.Setns(int(f.Fd()), p.kind)
		f.Close()
		if err != nil {
			return fmt.Errorf("join namespace %s: %w", p.pin, err)
		}
	}
	if req.utsPin != "" && req.hostname != "" {
		if err := unix.Sethostname([]byte(req.hostname)); err != nil {
			return fmt.Errorf("set hostname %q: %w", req.hostname, err)
		}
	}
	if req.netPin != "" {
		if err := loopbackUp(); err != nil {
			return err
		}
	}
	return writeSysctls(req.sysctls)
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring lo up: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: set flags: %w", err)
	}
	return nil
}

// pin bind-mounts a namespace file onto path, keeping the namespace alive
// without a process.
func pin(src, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("create namespace pin %s: %w", path, err)
	}
	f.Close()
	if err := unix.Mount(src, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("pin %s at %s: %w", src, path, err)
	}
	return nil
}

// unpin unmounts and removes a pin; absent pins are fine.
func unpin(path string) error {
	if path == "" {
		return nil
	}
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount namespace pin %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove namespace pin %s: %w", path, err)
	}
	return nil
}

// pinAlive reports whether path still pins a namespace (an nsfs mount).
func pinAlive(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// procStartTime is field 22 of /proc/<pid>/stat, to tell a pid apart from
// a later process that reused it. Zombies count as gone.
func procStartTime(pid int) (uint64, bool) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 20 || fields[0] == "Z" || fields[0] == "X" {
		return 0, false
	}
	st, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, false
	}
	return st, true
}

// mayHaveHolder reports whether a pod's creation starts berth-pause: for
// a shared PID namespace or its own user namespace.
func mayHaveHolder(cfg *criapi.PodSandboxConfig) bool {
	ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	return ns.GetPid() == criapi.NamespaceMode_POD || ns.GetUsernsOptions().GetMode() == criapi.NamespaceMode_POD
}

// stopHolders stops every berth-pause whose one argument is stateDir.
func stopHolders(stateDir string) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(args) == 2 && args[1] == stateDir && filepath.Base(args[0]) == "berth-pause" {
			start, ok := procStartTime(pid)
			if ok {
				stopPause(pid, start)
			}
		}
	}
}

// stopPause ends the pod's PID namespace holder: SIGTERM, then SIGKILL.
func stopPause(pid int, start uint64) {
	if pid <= 0 {
		return
	}
	alive := func() bool {
		st, ok := procStartTime(pid)
		return ok && (start == 0 || st == start)
	}
	if !alive() {
		return
	}
	_ = unix.Kill(pid, unix.SIGTERM)
	for i := 0; i < 100 && alive(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if alive() {
		_ = unix.Kill(pid, unix.SIGKILL)
		for i := 0; i < 100 && alive(); i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
}
