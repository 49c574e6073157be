package security

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/mounttest"
)

// socketNobody is the unprivileged host user the socket tests play.
const socketNobody = 65534

// asUser runs fn with uid and gid as credentials (no supplementary
// groups), on a thread of its own that never runs other code: the
// thread's credentials change (setresuid on one thread, not the process)
// and it exits with its goroutine.
func asUser(uid, gid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine.
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- fmt.Errorf("setgroups: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			errc <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			errc <- fmt.Errorf("setresuid: %w", e)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// dialUnixAs connects to the unix socket at path with uid and gid as
// credentials (asUser). A path longer than sun_path is reached through a
// descriptor of its directory opened as root.
func dialUnixAs(uid, gid int, path string) error {
	dirFD := -1
	if len(path) >= 100 {
		fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", filepath.Dir(path), err)
		}
		defer unix.Close(fd)
		dirFD = fd
	}
	return asUser(uid, gid, func() error {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		name := path
		if dirFD >= 0 {
			name = fmt.Sprintf("/proc/thread-self/fd/%d/%s", dirFD, filepath.Base(path))
		}
		return unix.Connect(fd, &unix.SockaddrUnix{Name: name})
	})
}

// openAs opens path read-only with uid and gid as credentials (asUser)
// and reads a byte of it.
func openAs(uid, gid int, path string) error {
	return asUser(uid, gid, func() error {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		_, err = unix.Read(fd, make([]byte, 1))
		return err
	})
}

// The CRI socket is root-equivalent: it is 0660 root:root, a host user
// gets EACCES on connect, and it never exists with another mode, even for
// a moment and under umask 0 (it is bound elsewhere, chmodded, then
// renamed into place: the directory sees it moved in, never created).
func TestCRISocketClosedToHostUsers(t *testing.T) {
	var sock string
	inFD := -1
	d := berthdtest.Start(t, berthdtest.Options{
		Configure: func(c *config.Config) {
			sock = c.SocketPath()
			// Others may search it, as /run: only the socket's own mode
			// stands between the host user and it.
			if err := os.Chmod(filepath.Dir(c.Root), 0o711); err != nil {
				t.Fatal(err)
			}
		},
		StartProcess: func(cmd *exec.Cmd) error {
			in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
			if err != nil {
				return err
			}
			if _, err := unix.InotifyAddWatch(in, filepath.Dir(sock), unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB); err != nil {
				unix.Close(in)
				return err
			}
			inFD = in
			t.Cleanup(func() { unix.Close(in) })
			// Under umask 0 a socket bound in place is 0777 until chmod.
			args := append([]string{"sh", "-c", `umask 000 && exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)
			cmd.Path, cmd.Args = "/bin/sh", args
			return cmd.Start()
		},
	})
	fi, err := os.Lstat(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("%s: %v owned by %d:%d, want a socket 0660 root:root", d.Socket, fi.Mode(), st.Uid, st.Gid)
	}
	if err := dialUnixAs(0, 0, d.Socket); err != nil {
		t.Fatalf("root cannot connect to %s: %v", d.Socket, err)
	}
	if err := dialUnixAs(socketNobody, socketNobody, d.Socket); !errors.Is(err, unix.EACCES) {
		t.Errorf("nobody connecting to %s: %v, want EACCES", d.Socket, err)
	}
	// What the socket's directory saw of its name while berthd started.
	events := readSocketEvents(t, inFD, filepath.Base(d.Socket))
	for _, ev := range events {
		if ev == "IN_CREATE" {
			t.Errorf("%s was created in place (%v): it existed with the umask's mode (0777 here) before its chmod to 0660", d.Socket, events)
		}
	}
	if len(events) == 0 {
		t.Errorf("no event for %s in its directory", d.Socket)
	}
}

// lazy.sock, where berthd answers berth-lazy's range requests with
// registry content fetched with the pulls' credentials, is root's alone
// (0600) in berthd's root, which others may traverse (0711): like the CRI
// socket, it never exists with another mode, even for a moment and under
// umask 0, or a host user connecting then would keep the connection.
func TestLazySocketNeverOpenToHostUsers(t *testing.T) {
	var root string
	inFD := -1
	d := berthdtest.Start(t, berthdtest.Options{
		Configure: func(c *config.Config) {
			lazyConfigure(t)(c)
			root = c.Root
			// Made here, to be watched from the start; berthd keeps it.
			if err := os.Mkdir(root, 0o711); err != nil {
				t.Fatal(err)
			}
			// What a berthd killed between bind and rename leaves (now,
			// and before sockbind named the dir for its socket): gone
			// once berthd is up.
			for _, stale := range []string{".bind-lazy.sock", ".bind-4242"} {
				if err := os.MkdirAll(filepath.Join(root, stale, "s"), 0o700); err != nil {
					t.Fatal(err)
				}
			}
		},
		StartProcess: func(cmd *exec.Cmd) error {
			in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
			if err != nil {
				return err
			}
			if _, err := unix.InotifyAddWatch(in, root, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ATTRIB); err != nil {
				unix.Close(in)
				return err
			}
			inFD = in
			t.Cleanup(func() { unix.Close(in) })
			args := append([]string{"sh", "-c", `umask 000 && exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)
			cmd.Path, cmd.Args = "/bin/sh", args
			return cmd.Start()
		},
	})
	sock := filepath.Join(d.Root, "lazy.sock")
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("%s: %v owned by %d:%d, want a socket 0600 root:root", sock, fi.Mode(), st.Uid, st.Gid)
	}
	if err := dialUnixAs(0, 0, sock); err != nil {
		t.Fatalf("root cannot connect to %s: %v", sock, err)
	}
	if err := dialUnixAs(socketNobody, socketNobody, sock); !errors.Is(err, unix.EACCES) {
		t.Errorf("nobody connecting to %s: %v, want EACCES", sock, err)
	}
	for _, stale := range []string{".bind-lazy.sock", ".bind-4242"} {
		if _, err := os.Lstat(filepath.Join(d.Root, stale)); !os.IsNotExist(err) {
			t.Errorf("a stale private dir %s left in berthd's root: %v", stale, err)
		}
	}
	events := readSocketEvents(t, inFD, filepath.Base(sock))
	if slices.Contains(events, "IN_CREATE") {
		t.Errorf("%s was created in place (%v): it existed with the umask's mode (0777 here) before its chmod to 0600", sock, events)
	}
	if len(events) == 0 {
		t.Errorf("no event for %s in its directory", sock)
	}
}

// readSocketEvents drains the inotify descriptor in and returns the event
// kinds (IN_CREATE, IN_MOVED_TO, IN_ATTRIB) seen for name.
func readSocketEvents(t *testing.T, in int, name string) []string {
	t.Helper()
	var kinds []string
	buf := make([]byte, 64*1024)
	for {
		n, err := unix.Read(in, buf)
		if err != nil || n <= 0 {
			return kinds
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if strings.TrimRight(string(nameBytes), "\x00") != name {
				continue
			}
			switch {
			case ev.Mask&unix.IN_CREATE != 0:
				kinds = append(kinds, "IN_CREATE")
			case ev.Mask&unix.IN_MOVED_TO != 0:
				kinds = append(kinds, "IN_MOVED_TO")
			case ev.Mask&unix.IN_ATTRIB != 0:
				kinds = append(kinds, "IN_ATTRIB")
			}
		}
	}
}

// CVE-2020-15257: containerd's shim listened on an abstract unix socket,
// which lives in the network namespace: a hostNetwork container reached
// it. berthd, the keeper, the monitor and the lazy-layer server
// (berth-lazy, serving a lazily pulled image's layers) hold no abstract
// socket; their sockets (node.sock, each pod's shim.sock, lazy.sock) are
// paths a hostNetwork container cannot reach (it has its own mount
// namespace), and a host user gets EACCES on them. The scratch dir above
// berthd's root and state is traversable, as /var/lib is on a node
// (lazyConfigure), so that the EACCES is berth's doing: lazy.sock, in
// the traversable root, is closed by its own mode (0600) alone.
func TestBerthSocketsUnreachableFromHostNetworkAndHostUsers(t *testing.T) {
	e := startPhEnv(t, berthdtest.Options{Configure: lazyConfigure(t)})
	lazyRef := pushLazy(t, e.reg, "lazy/sockets:1")
	if _, err := e.d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: lazyRef}}); err != nil {
		t.Fatalf("pull %s: %v", lazyRef, err)
	}
	if m := mounttest.FUSEBelow(t, e.d.Root); len(m) == 0 {
		t.Fatalf("%s was not pulled lazily: no FUSE mount below %s", lazyRef, e.d.Root)
	}
	hostNet := &criapi.NamespaceOption{Network: criapi.NamespaceMode_NODE, Pid: criapi.NamespaceMode_CONTAINER, Ipc: criapi.NamespaceMode_POD}
	pod, podID := e.runPod(t, "hostnet-sockets", hostNet)
	id := e.runContainer(t, podID, pod, e.container("prober", hostNet))
	// A second pod with its own network, on the lazy image: its
	// shim.sock too, and berth-lazy serving its layers.
	ownNet := &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER}
	pod2, podID2 := e.runPod(t, "ownnet-sockets", ownNet)
	lazyCtr := e.container("other", ownNet)
	lazyCtr.Image.Image = lazyRef
	lazyID := e.runContainer(t, podID2, pod2, lazyCtr)
	if out, code := e.sh(t, lazyID, "cat /data/hello"); code != 0 || strings.TrimSpace(out) != lazyContent {
		t.Fatalf("the lazy image's container reading its file: exit %d, %q", code, out)
	}

	// berth's processes and every unix socket they hold.
	pids := map[string][]int{"berthd": {e.d.Pid()}}
	pids["keeper"] = berthdtest.ShimPids(e.d.State, "keeper")
	pids["monitor"] = berthdtest.ShimPids(e.d.State, "monitor")
	pids["berth-lazy"] = lazyServerPids(e.d.State)
	for _, who := range []string{"monitor", "berth-lazy"} {
		if len(pids[who]) == 0 {
			t.Fatalf("no %s found for %s", who, e.d.State)
		}
	}
	unixSockets := procNetUnix(t, fmt.Sprintf("/proc/%d/net/unix", e.d.Pid()))
	held := map[string]int{}
	for who, ps := range pids {
		for _, pid := range ps {
			for _, inode := range socketInodes(t, pid) {
				name, ok := unixSockets[inode]
				if !ok {
					continue // not a unix socket
				}
				held[who]++
				if strings.HasPrefix(name, "@") {
					t.Errorf("%s (pid %d) holds the abstract unix socket %q", who, pid, name)
				}
			}
		}
	}
	if held["berthd"] == 0 || held["berth-lazy"] == 0 {
		t.Fatalf("unix sockets held: %v; the test sees nothing of berthd's or berth-lazy's", held)
	}

	// The sockets on disk: berth.sock, node.sock, lazy.sock and every
	// shim.sock. lazy.sock is root's alone: 0600 root:root.
	lazySock := filepath.Join(e.d.Root, "lazy.sock")
	fi, err := os.Lstat(lazySock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("%s: %v owned by %d:%d, want a socket 0600 root:root", lazySock, fi.Mode(), st.Uid, st.Gid)
	}
	var paths []string
	for _, top := range []string{e.d.State, e.d.Root, filepath.Dir(e.d.Socket)} {
		_ = filepath.WalkDir(top, func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.Type() == fs.ModeSocket && (de.Name() == "node.sock" || de.Name() == "shim.sock" || p == e.d.Socket || p == lazySock) && !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
			return nil
		})
	}
	var sawNode, sawShim, sawLazy bool
	for _, p := range paths {
		sawNode = sawNode || filepath.Base(p) == "node.sock"
		sawShim = sawShim || filepath.Base(p) == "shim.sock"
		sawLazy = sawLazy || p == lazySock
		if err := dialUnixAs(0, 0, p); err != nil {
			t.Errorf("root cannot connect to %s: %v", p, err)
		}
		if err := dialUnixAs(socketNobody, socketNobody, p); !errors.Is(err, unix.EACCES) {
			t.Errorf("nobody connecting to %s: %v, want EACCES", p, err)
		}
		// From the hostNetwork container, by path: not there.
		if out, code := e.sh(t, id, "ls -l "+p+" 2>&1; test -e "+p); code == 0 {
			t.Errorf("a hostNetwork container sees %s: %q", p, out)
		}
	}
	if !sawNode || !sawShim || !sawLazy {
		t.Fatalf("found node.sock %v, shim.sock %v, lazy.sock %v among %v", sawNode, sawShim, sawLazy, paths)
	}
	// The container shares the host's network namespace, so it sees the
	// host's unix sockets in /proc/net/unix: none of berth's is abstract.
	out, _ := e.sh(t, id, "cat /proc/net/unix")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 8 && strings.HasPrefix(f[7], "@") && strings.Contains(f[7], "berth") {
			t.Errorf("an abstract socket of berth's is visible to a hostNetwork container: %q", line)
		}
	}
}

// procNetUnix maps socket inode to its name in a /proc/net/unix table
// ("" for an unnamed one, "@…" for an abstract one).
func procNetUnix(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 7 {
			continue
		}
		name := ""
		if len(f) >= 8 {
			name = f[7]
		}
		m[f[6]] = name
	}
	return m
}

// socketInodes lists the inodes of the sockets pid holds.
func socketInodes(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	var inodes []string
	for _, e := range entries {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes = append(inodes, strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"))
		}
	}
	return inodes
}
