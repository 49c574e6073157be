package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// conmonNode runs containers the way CRI-O (1.2x-1.3x, cgroupfs manager,
// drop_infra_ctr = true, so no pause container) does: one conmon per
// container, started with CRI-O's flags and its sync and start pipes,
// detached (conmon forks itself away), conmon doing `runc create` and
// CRI-O then `runc start`. Its own dir and cgroup parent, so one case
// shares nothing with the next or with berth's.
//
// What differs from a real CRI-O node, none of it in conmon's memory: the
// rootfs is a read-only busybox dir rather than an overlay mount, and the
// bundle's spec is bundletest's minimal one rather than CRI-O's.
type conmonNode struct {
	b      *testing.B
	conmon string
	runc   string
	dir    string
	lower  string
	cgroup string
	scope  leakcheck.Scope
	before leakcheck.Snapshot
	ctrs   []*conmonCtr
}

type conmonCtr struct {
	id, bundle string
	pid        int // conmon's, from its pidfile
}

// conmonEnv is CRI-O's default monitor_env.
const conmonEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// conmonUnusable says why conmon cannot be measured here ("" when it can).
func conmonUnusable() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := exec.LookPath("conmon"); err != nil {
		return "conmon is not installed (hack/install-deps.sh bench installs Debian's conmon)"
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return "runc is not installed"
	}
	return ""
}

func newConmonNode(b *testing.B) (*conmonNode, error) {
	conmon, err := exec.LookPath("conmon")
	if err != nil {
		return nil, fmt.Errorf("find conmon: %w", err)
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, fmt.Errorf("find runc: %w", err)
	}
	// Absolute: conmon runs runc from the bundle, CRI-O passes its path.
	if runc, err = filepath.Abs(runc); err != nil {
		return nil, fmt.Errorf("find runc: %w", err)
	}
	dir, err := os.MkdirTemp("", "berth-bench-conmon-")
	if err != nil {
		return nil, fmt.Errorf("create conmon bench dir: %w", err)
	}
	n := &conmonNode{b: b, conmon: conmon, runc: runc, dir: dir, lower: filepath.Join(dir, "layer"),
		cgroup: "berthbench-" + filepath.Base(dir)}
	n.scope = leakcheck.Scope{Dir: dir, State: dir, CgroupParent: n.cgroup}
	n.before = leakcheck.Take(b, n.scope)
	b.Cleanup(n.sweep)
	for _, d := range []string{"exits", "sockets", "runc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("create conmon bench dir: %w", err)
		}
	}
	bundletest.WriteRootfs(b, n.lower)
	return n, nil
}

// start creates and starts one container under its own conmon, as CRI-O's
// CreateContainer and StartContainer do.
func (n *conmonNode) start(pod, name string, args []string) error {
	id := fmt.Sprintf("%s-%s", pod, name)
	bundle := filepath.Join(n.dir, "run", id)   // CRI-O: /run/containers/storage/.../userdata
	persist := filepath.Join(n.dir, "lib", id)  // CRI-O: /var/lib/containers/storage/.../userdata
	logDir := filepath.Join(n.dir, "logs", pod) // the kubelet's pod log dir
	for _, d := range []string{bundle, persist, logDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create dirs of %s: %w", id, err)
		}
	}
	spec := bundletest.Spec(n.lower, n.cgroup, id, args)
	spec.Root.Readonly = true
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode spec of %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("write spec of %s: %w", id, err)
	}
	c := &conmonCtr{id: id, bundle: bundle}
	n.ctrs = append(n.ctrs, c)

	// CRI-O's pipes: conmon reports the container's pid (or why create
	// failed) on the sync pipe and waits on the start pipe until CRI-O has
	// moved it into its cgroup.
	syncR, syncW, err := socketpair("sync pipe")
	if err != nil {
		return fmt.Errorf("sync pipe for %s: %w", id, err)
	}
	defer syncR.Close()
	startW, startR, err := socketpair("start pipe")
	if err != nil {
		syncW.Close()
		return fmt.Errorf("start pipe for %s: %w", id, err)
	}
	defer startW.Close()
	// conmon's own messages before it detaches (it logs to syslog after).
	stderr, err := os.Create(filepath.Join(persist, "conmon.stderr"))
	if err != nil {
		syncW.Close()
		startR.Close()
		return fmt.Errorf("conmon stderr for %s: %w", id, err)
	}
	defer stderr.Close()
	conmonPidfile := filepath.Join(persist, "conmon-pidfile")
	cmd := exec.Command(n.conmon,
		"-b", bundle,
		"-c", id,
		"--exit-dir", filepath.Join(n.dir, "exits"),
		"-l", "k8s-file:"+filepath.Join(logDir, name+".log"),
		"--log-level", "info",
		"-n", fmt.Sprintf("k8s_%s_%s_bench_uid-%s_0", name, pod, pod),
		"-P", conmonPidfile,
		"-p", filepath.Join(bundle, "pidfile"),
		"--persist-dir", persist,
		"-r", n.runc,
		"--runtime-arg", "--root="+filepath.Join(n.dir, "runc"),
		"--socket-dir-path", filepath.Join(n.dir, "sockets"),
		"--syslog",
		"-u", id,
	)
	cmd.Dir = bundle
	cmd.Stderr = stderr
	cmd.ExtraFiles = []*os.File{syncW, startR}
	cmd.Env = []string{conmonEnv, "_OCI_SYNCPIPE=3", "_OCI_STARTPIPE=4"}
	err = cmd.Start()
	syncW.Close()
	startR.Close()
	if err != nil {
		return fmt.Errorf("start conmon for %s: %w", id, err)
	}
	conmonErr := func(err error) error {
		msg, _ := os.ReadFile(stderr.Name())
		if s := strings.TrimSpace(string(msg)); s != "" {
			return fmt.Errorf("%w (conmon: %s)", err, s)
		}
		return err
	}
	if err := n.joinCgroup(cmd.Process.Pid, "crio-conmon-"+id); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("move conmon of %s into its cgroup: %w", id, err)
	}
	if _, err := startW.Write([]byte{0}); err != nil {
		_ = cmd.Process.Kill()
		werr := cmd.Wait()
		return conmonErr(fmt.Errorf("conmon for %s ended (%v) before its start pipe was written: %w", id, werr, err))
	}
	// The first conmon exits once it forked the one that stays.
	if err := cmd.Wait(); err != nil {
		return conmonErr(fmt.Errorf("conmon for %s: %w", id, err))
	}
	pid, err := readSyncPid(syncR, 30*time.Second)
	if err != nil {
		return conmonErr(fmt.Errorf("create %s through conmon: %w", id, err))
	}
	if pid <= 0 {
		return conmonErr(fmt.Errorf("create %s through conmon: no pid", id))
	}
	data, err = os.ReadFile(conmonPidfile)
	if err != nil {
		return fmt.Errorf("read conmon's pidfile of %s: %w", id, err)
	}
	if c.pid, err = strconv.Atoi(strings.TrimSpace(string(data))); err != nil {
		return fmt.Errorf("parse conmon's pidfile of %s: %w", id, err)
	}
	if out, err := n.runcCmd("start", id).CombinedOutput(); err != nil {
		return fmt.Errorf("runc start %s: %w: %s", id, err, out)
	}
	return nil
}

// socketpair is CRI-O's newPipe: a SOCK_SEQPACKET pair, close-on-exec
// (exec.Cmd dups conmon's end onto 3 or 4 without the flag).
func socketpair(name string) (ours, conmons *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_LOCAL, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), name), os.NewFile(uintptr(fds[1]), name+" (conmon's end)"), nil
}

// readSyncPid reads conmon's {"pid": N, "message": "..."} from the sync pipe.
func readSyncPid(f *os.File, timeout time.Duration) (int, error) {
	type syncInfo struct {
		Pid     int    `json:"pid"`
		Message string `json:"message,omitempty"`
	}
	type result struct {
		si  syncInfo
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		r.err = json.NewDecoder(f).Decode(&r.si)
		ch <- r
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return 0, fmt.Errorf("read sync pipe (conmon probably exited): %w", r.err)
		}
		if r.si.Pid == -1 {
			return 0, fmt.Errorf("container create failed: %s", r.si.Message)
		}
		return r.si.Pid, nil
	case <-time.After(timeout):
		f.Close() // ends the decoder
		return 0, fmt.Errorf("no pid on the sync pipe after %v", timeout)
	}
}

// joinCgroup moves pid into <cgroup parent>/<name> in every hierarchy, as
// CRI-O's cgroupfs manager puts each conmon in the pod's cgroup parent.
func (n *conmonNode) joinCgroup(pid int, name string) error {
	for _, root := range cgroupRoots() {
		d := filepath.Join(root, n.cgroup, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if filepath.Base(root) == "cpuset" {
			if err := inheritCpuset(root, filepath.Join(n.cgroup, name)); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// inheritCpuset gives each new v1 cpuset cgroup from root down to rel its
// parent's cpus and mems, as libcontainer does: a task cannot join a
// cpuset that has none.
func inheritCpuset(root, rel string) error {
	parent := root
	for _, part := range strings.Split(rel, "/") {
		d := filepath.Join(parent, part)
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				return err
			}
			if len(strings.TrimSpace(string(cur))) > 0 {
				continue
			}
			v, err := os.ReadFile(filepath.Join(parent, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("set %s of %s: %w", f, d, err)
			}
		}
		parent = d
	}
	return nil
}

// cgroupRoots lists the mounted hierarchies: each v1 controller's (and
// the hybrid unified one), or the v2 root alone.
func cgroupRoots() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.procs"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	var roots []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		// cpu,cpuacct style links name a hierarchy listed under its own name.
		if e.Type()&os.ModeSymlink != 0 {
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			roots = append(roots, p)
		}
	}
	return roots
}

func (n *conmonNode) runcCmd(args ...string) *exec.Cmd {
	return exec.Command(n.runc, append([]string{"--root=" + filepath.Join(n.dir, "runc")}, args...)...)
}

// pids lists the conmon processes, failing if one is gone or not conmon.
func (n *conmonNode) pids() ([]int, error) {
	var pids []int
	for _, c := range n.ctrs {
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(c.pid) + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "conmon" {
			return nil, fmt.Errorf("conmon of %s (pid %d) is gone", c.id, c.pid)
		}
		pids = append(pids, c.pid)
	}
	return pids, nil
}

// stop tears the node down as CRI-O's StopContainer and RemoveContainer
// do (kill, conmon writes the exit and exits, runc delete), removes the
// conmon cgroups and the dir, then checks that nothing is left.
func (n *conmonNode) stop() error {
	var errs []error
	for _, c := range n.ctrs {
		if out, err := n.runcCmd("kill", c.id, "KILL").CombinedOutput(); err != nil && c.pid != 0 && !strings.Contains(string(out), "not running") {
			errs = append(errs, fmt.Errorf("runc kill %s: %w: %s", c.id, err, out))
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, c := range n.ctrs {
		if c.pid == 0 {
			continue
		}
		for alive(c.pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(c.pid) {
			errs = append(errs, fmt.Errorf("conmon of %s (pid %d) did not exit after its container", c.id, c.pid))
		} else if _, err := os.Stat(filepath.Join(n.dir, "exits", c.id)); err != nil {
			errs = append(errs, fmt.Errorf("conmon of %s wrote no exit file: %w", c.id, err))
		}
	}
	for _, c := range n.ctrs {
		if out, err := n.runcCmd("delete", "--force", c.id).CombinedOutput(); err != nil && !strings.Contains(string(out), "not exist") {
			errs = append(errs, fmt.Errorf("runc delete %s: %w: %s", c.id, err, out))
		}
		for _, root := range cgroupRoots() {
			if err := unix.Rmdir(filepath.Join(root, n.cgroup, "crio-conmon-"+c.id)); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove conmon cgroup of %s: %w", c.id, err))
			}
		}
	}
	n.ctrs = nil
	if err := os.RemoveAll(n.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", n.dir, err))
	}
	if leaks := leakcheck.Diff(n.before, leakcheck.Take(n.b, n.scope)); len(leaks) > 0 {
		errs = append(errs, fmt.Errorf("left behind %d items:\n%s", len(leaks), strings.Join(leaks, "\n")))
	}
	n.sweep()
	return errors.Join(errs...)
}

// sweep kills and removes whatever stop did not (idempotent; also the
// test's cleanup when a case failed half-way).
func (n *conmonNode) sweep() {
	if err := berthdtest.CleanupNode(n.dir, n.cgroup); err != nil {
		n.b.Errorf("conmon bench cleanup: %v", err)
	}
}

// alive says whether pid runs (a zombie waiting for init does not).
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised comm.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return syscall.Kill(pid, 0) == nil
}

// conmonRow is conmon's memory for one case, per pod like berth's.
type conmonRow struct {
	PssKiB    float64 `json:"pss_kib_per_pod"`
	AnonKiB   float64 `json:"pss_anon_kib_per_pod"`
	FileKiB   float64 `json:"pss_file_kib_per_pod"`
	RssKiB    float64 `json:"rss_kib_per_pod"`
	PerCtrKiB float64 `json:"pss_kib_per_container"`
	Processes int     `json:"processes"`
	Threads   int     `json:"threads"`
}

// measureConmon runs pods × perPod containers under conmon with the
// workload of berth's rows, measures every conmon after the same settling
// time, and tears it all down.
func measureConmon(b *testing.B, pods, perPod int, settle time.Duration) (*conmonRow, error) {
	n, err := newConmonNode(b)
	if err != nil {
		return nil, err
	}
	row, err := func() (*conmonRow, error) {
		for p := 0; p < pods; p++ {
			for c := 0; c < perPod; c++ {
				if err := n.start(fmt.Sprintf("pod%d", p), fmt.Sprintf("c%d", c), workloadArgs(c)); err != nil {
					return nil, err
				}
			}
		}
		time.Sleep(settle)
		pids, err := n.pids()
		if err != nil {
			return nil, err
		}
		// conmon really carries the output: the logging container's
		// lines are in its k8s-file log.
		log, err := os.ReadFile(filepath.Join(n.dir, "logs", "pod0", "c0.log"))
		if err != nil || !strings.Contains(string(log), " stdout F tick\n") {
			return nil, fmt.Errorf("no tick in conmon's log of pod0-c0 (%v): %q", err, log)
		}
		row := &conmonRow{Processes: len(pids)}
		for _, pid := range pids {
			m := smapsRollup(b, pid)
			row.PssKiB += m["Pss"]
			row.AnonKiB += m["Pss_Anon"]
			row.FileKiB += m["Pss_File"]
			row.RssKiB += m["Rss"]
			if task, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task"); err == nil {
				row.Threads += len(task)
			}
		}
		np := float64(pods)
		row.PssKiB /= np
		row.AnonKiB /= np
		row.FileKiB /= np
		row.RssKiB /= np
		row.PerCtrKiB = row.PssKiB / float64(perPod)
		return row, nil
	}()
	if serr := n.stop(); serr != nil {
		if err != nil {
			// After a failed start, teardown trouble is part of why.
			b.Logf("conmon teardown after %v: %v", err, serr)
		} else {
			// A leak is the bench's own failure, not a reason to skip conmon.
			b.Errorf("conmon teardown: %v", serr)
		}
	}
	return row, err
}
