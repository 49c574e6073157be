package security

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// berth's side of "Leaky Vessels" (CVE-2024-21626): no descriptor of
// berthd, the keeper or the monitor (a state directory, a log file, a
// socket, a cgroup directory) reaches a container's process or an exec,
// with or without a terminal, however many descriptors berthd holds.
// Every descriptor berth's processes hold is close-on-exec, and a
// container's pid 1 and an exec hold only their stdio.
func TestNoDescriptorOfBerthReachesContainers(t *testing.T) {
	// berthd is handed a descriptor it did not open (as a careless
	// service manager or shell would): it must go no further.
	inherited, err := os.Create(filepath.Join(t.TempDir(), "inherited-by-berthd"))
	if err != nil {
		t.Fatal(err)
	}
	defer inherited.Close()
	e := startPhEnv(t, berthdtest.Options{StartProcess: func(cmd *exec.Cmd) error {
		cmd.ExtraFiles = []*os.File{inherited}
		return cmd.Start()
	}})
	// Hundreds of CRI connections: berthd holds a descriptor for each.
	before := fdCount(t, e.d.Pid())
	for i := 0; i < 300; i++ {
		c, err := net.Dial("unix", e.d.Socket)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
	}
	ns := &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER}
	pod, podID := e.runPod(t, "fdleak", ns)
	plain := e.runContainer(t, podID, pod, e.container("plain", ns))
	ttyCfg := e.container("tty", ns)
	ttyCfg.Tty, ttyCfg.Stdin = true, true
	tty := e.runContainer(t, podID, pod, ttyCfg)
	if n := fdCount(t, e.d.Pid()); n < before+300 {
		t.Fatalf("berthd holds %d descriptors (%d before the connections): the connections did not land", n, before)
	}

	// Every descriptor of berthd, the keeper and the monitor is
	// close-on-exec: nothing they start inherits one by accident.
	procs := map[string][]int{"berthd": {e.d.Pid()}}
	procs["keeper"] = berthdtest.ShimPids(e.d.State, "keeper")
	procs["monitor"] = berthdtest.ShimPids(e.d.State, "monitor")
	for who, pids := range procs {
		for _, pid := range pids {
			for fd, target := range fdsWithoutCloexec(t, pid) {
				t.Errorf("%s (pid %d): descriptor %d (%s) is not close-on-exec", who, pid, fd, target)
			}
			if who == "berthd" {
				continue
			}
			entries, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			for _, ent := range entries {
				if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, ent.Name())); l == inherited.Name() {
					t.Errorf("%s (pid %d) holds berthd's inherited descriptor as %s", who, pid, ent.Name())
				}
			}
		}
	}

	forbidden := []string{e.d.Dir, e.d.Root, e.d.State, "/sys/fs/cgroup", "/var/lib/berth", "/run/berth"}
	check := func(what, listing string, allowDir bool) {
		t.Helper()
		fds := parseFDListing(listing)
		if len(fds) == 0 {
			t.Errorf("%s: no descriptors listed:\n%s", what, listing)
		}
		for fd, target := range fds {
			switch {
			case fd <= 2:
			case allowDir && strings.HasPrefix(target, "/proc/") && strings.HasSuffix(target, "/fd"):
				// ls's own descriptor of the directory it lists.
			default:
				t.Errorf("%s: descriptor %d -> %s beyond stdio", what, fd, target)
			}
			for _, f := range forbidden {
				if target == f || strings.HasPrefix(target, f+"/") {
					t.Errorf("%s: descriptor %d -> %s leads into %s", what, fd, target, f)
				}
			}
		}
	}
	for name, id := range map[string]string{"plain": plain, "tty": tty} {
		out, code := e.sh(t, id, "ls -l /proc/1/fd")
		if code != 0 {
			t.Fatalf("%s: ls /proc/1/fd: exit %d %q", name, code, out)
		}
		check(name+" container's pid 1", out, false)
		out, code = e.sh(t, id, "ls -l /proc/self/fd")
		if code != 0 {
			t.Fatalf("%s: ls /proc/self/fd: exit %d %q", name, code, out)
		}
		check(name+" container, exec without a terminal", out, true)

		// An exec with a terminal, through the streaming server.
		resp, err := e.d.Runtime.Exec(berthdtest.Ctx(t), &criapi.ExecRequest{ContainerId: id, Cmd: []string{"ls", "-l", "/proc/self/fd"}, Stdout: true, Tty: true})
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		u, err := url.Parse(resp.Url)
		if err != nil {
			t.Fatal(err)
		}
		ex, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := ex.StreamWithContext(berthdtest.Ctx(t), remotecommand.StreamOptions{Stdout: &buf, Tty: true}); err != nil {
			t.Fatalf("%s: tty exec: %v (%q)", name, err, buf.String())
		}
		check(name+" container, exec with a terminal", strings.ReplaceAll(buf.String(), "\r", ""), true)
	}
}

// parseFDListing reads busybox `ls -l /proc/<pid>/fd`: descriptor number
// to link target.
func parseFDListing(out string) map[int]string {
	fds := map[int]string{}
	for _, line := range strings.Split(out, "\n") {
		i := strings.Index(line, " -> ")
		if i < 0 {
			continue
		}
		f := strings.Fields(line[:i])
		if len(f) == 0 {
			continue
		}
		if fd, err := strconv.Atoi(f[len(f)-1]); err == nil {
			fds[fd] = strings.TrimSpace(line[i+4:])
		}
	}
	return fds
}

func fdCount(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// fdsWithoutCloexec lists pid's descriptors above stderr that are not
// O_CLOEXEC (from /proc/<pid>/fdinfo), with their targets.
func fdsWithoutCloexec(t *testing.T, pid int) map[int]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	open := map[int]string{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		info, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, os.ErrNotExist) {
			continue // closed meanwhile
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			v, ok := strings.CutPrefix(line, "flags:")
			if !ok {
				continue
			}
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			if err == nil && flags&0o2000000 == 0 {
				target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd))
				open[fd] = target
			}
		}
	}
	return open
}
