package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/testutil/leakcheck"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// faultKind is one fault the soak injects. Bound is its recovery bound:
// from the fault's end (berthd serving again, the monitor resumed, the
// disk freed) every pod that was Ready when it began is Ready again
// within it, and no pod is not Ready longer than its end plus it
// (decision 3500 says why each).
type faultKind struct {
	Bound time.Duration
	// Run injects the fault and returns once it ended, with what happened
	// (a note for the report) and a finding: something berth got wrong.
	Run func(f *faulter) (note string, finding error)
}

// faultKinds are every fault, by name (SOAK_FAULTS picks among them).
var faultKinds = map[string]faultKind{
	"berthd-kill":             {Bound: 60 * time.Second, Run: (*faulter).berthdKill},
	"keeper-kill":             {Bound: 30 * time.Second, Run: (*faulter).keeperKill},
	"monitor-kill":            {Bound: 30 * time.Second, Run: (*faulter).monitorKill},
	"monitor-stop":            {Bound: 30 * time.Second, Run: (*faulter).monitorStop},
	"berthd-kill-mid-pull":    {Bound: 60 * time.Second, Run: (*faulter).berthdKillMidPull},
	"berthd-crash-mid-unpack": {Bound: 60 * time.Second, Run: (*faulter).berthdCrashMidUnpack},
	"cni-fail-once":           {Bound: 90 * time.Second, Run: (*faulter).cniFailOnce},
	"disk-full-pull":          {Bound: 60 * time.Second, Run: (*faulter).diskFullPull},
}

func faultNames() []string {
	var names []string
	for name := range faultKinds {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// monitorStopFor is how long monitor-stop keeps the monitor stopped (the
// keeper's watchdog replaces it after ~15 s, decision 3300).
const monitorStopFor = 30 * time.Second

// diskFreeMiB is what disk-full-pull leaves free on the root: less than
// layersImage's new layers, more than the kubelet's 1% eviction
// threshold of a 1 GiB root.
const diskFreeMiB = 12

// faulter injects faults into a node.
type faulter struct {
	n   *node
	w   *workload
	rng *rand.Rand
}

// berthdKill: kill -9 of berthd, then its restart on the same root.
func (f *faulter) berthdKill() (string, error) {
	pid := f.n.d.Pid()
	f.n.d.Kill()
	if err := f.n.restartBerthd(); err != nil {
		return "", err
	}
	return fmt.Sprintf("killed %d, restarted as %d", pid, f.n.d.Pid()), nil
}

// shimPid picks the node's keeper or monitor to kill: a monitor whose
// keeper lives (an orphaned monitor, after a keeper-kill, has no keeper
// to restart it: killing it loses its containers by design, 1701), a
// keeper that has a monitor. When there is none (a keeper-kill left
// only orphaned monitors and no pod came since) it replaces a pod, whose
// start brings a new keeper and monitor, and waits for them (a minute).
func (f *faulter) shimPid(mode string) int {
	if pid := f.liveShimPid(mode); pid != 0 {
		return pid
	}
	if _, err := f.w.replace(); err != nil {
		return 0
	}
	var pid int
	waitUntil(time.Minute, func() bool {
		pid = f.liveShimPid(mode)
		return pid != 0
	})
	return pid
}

func (f *faulter) liveShimPid(mode string) int {
	keepers := berthdtest.ShimPids(f.n.d.State, "keeper")
	monitors := berthdtest.ShimPids(f.n.d.State, "monitor")
	isKeeper := map[int]bool{}
	for _, k := range keepers {
		isKeeper[k] = true
	}
	var pick []int
	for _, m := range monitors {
		if isKeeper[leakcheck.ParentPid(m)] {
			if mode == "monitor" {
				pick = append(pick, m)
			} else {
				pick = append(pick, leakcheck.ParentPid(m))
			}
		}
	}
	if len(pick) == 0 {
		return 0
	}
	sort.Ints(pick)
	return pick[len(pick)-1]
}

// keeperKill: kill -9 of the node's keeper. Its monitor runs on, orphaned,
// with every running container; the next new pod gets a new keeper and
// monitor (reliability.md, "What a crash of each process costs").
func (f *faulter) keeperKill() (string, error) {
	pid := f.shimPid("keeper")
	if pid == 0 {
		return "skipped: no keeper with a monitor", nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("kill keeper %d: %w", pid, err)
	}
	return fmt.Sprintf("killed keeper %d", pid), nil
}

// monitorKill: kill -9 of the monitor; its keeper starts the next, which
// adopts every container.
func (f *faulter) monitorKill() (string, error) {
	pid := f.shimPid("monitor")
	if pid == 0 {
		return "skipped: no monitor under a keeper", nil
	}
	keeper := leakcheck.ParentPid(pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("kill monitor %d: %w", pid, err)
	}
	start := time.Now()
	for time.Since(start) < time.Minute {
		for _, m := range berthdtest.ShimPids(f.n.d.State, "monitor") {
			if m != pid && leakcheck.ParentPid(m) == keeper {
				return fmt.Sprintf("killed monitor %d; keeper %d started %d after %s", pid, keeper, m, time.Since(start).Round(time.Millisecond)), nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("keeper %d started no monitor within a minute of monitor %d's kill -9", keeper, pid)
}

// monitorStop: SIGSTOP of the monitor for monitorStopFor, then SIGCONT
// (through a pidfd: the keeper's watchdog has likely killed and replaced
// it by then, decision 3300, and its pid may be reused).
func (f *faulter) monitorStop() (string, error) {
	pid := f.shimPid("monitor")
	if pid == 0 {
		return "skipped: no monitor under a keeper", nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return "", fmt.Errorf("pidfd of monitor %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGSTOP, nil, 0); err != nil {
		return "", fmt.Errorf("stop monitor %d: %w", pid, err)
	}
	time.Sleep(monitorStopFor)
	err = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return fmt.Sprintf("stopped monitor %d; replaced by its keeper within %s", pid, monitorStopFor), nil
	case err != nil:
		return "", fmt.Errorf("resume monitor %d: %w", pid, err)
	}
	return fmt.Sprintf("stopped monitor %d for %s, resumed (not replaced)", pid, monitorStopFor), nil
}

// pull pulls ref with the soak's client (up to 5 min).
func (f *faulter) pull(ref string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, err := f.n.d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	return err
}

// pullAgainAndRemove is the end of every pull fault: the image pulls
// cleanly now, nothing of the cut pull is left in ingest/, and it is
// removed so that the next pull fault starts from nothing again.
func (f *faulter) pullAgainAndRemove() error {
	var errs []error
	if err := f.pull(layersImage); err != nil {
		errs = append(errs, fmt.Errorf("pull %s after the fault: %w", layersImage, err))
	}
	if left := ingestLeft(f.n.d.Root); len(left) > 0 {
		errs = append(errs, fmt.Errorf("ingest files left after a clean pull: %v", left))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := f.n.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: layersImage}}); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", layersImage, err))
	}
	return errors.Join(errs...)
}

// berthdKillMidPull: kill -9 of berthd while it pulls layersImage, its
// second new layer stalled halfway by the registry (the first is
// unpacked, the second half streamed into its unpack).
func (f *faulter) berthdKillMidPull() (string, error) {
	hold := f.n.reg.HoldBlob(f.n.t, f.n.layerDigests[1])
	defer hold.Release()
	done := make(chan error, 1)
	go func() { done <- f.pull(layersImage) }()
	select {
	case <-hold.Arrived:
	case err := <-done:
		return "", fmt.Errorf("pull of %s ended before its held layer: %v", layersImage, err)
	case <-time.After(2 * time.Minute):
		return "", fmt.Errorf("pull of %s never reached its held layer", layersImage)
	}
	time.Sleep(time.Duration(f.rng.IntN(500)) * time.Millisecond)
	pid := f.n.d.Pid()
	f.n.d.Kill()
	pullErr := <-done
	hold.Release()
	if err := f.n.restartBerthd(); err != nil {
		return "", err
	}
	note := fmt.Sprintf("killed %d mid-pull (the pull: %v)", pid, pullErr)
	return note, f.pullAgainAndRemove()
}

// berthdCrashMidUnpack: berthd restarted with the mid-unpack crash point
// armed exits (86, as a kill -9 there) once a pull of layersImage has
// unpacked its first new layer; then unarmed again.
func (f *faulter) berthdCrashMidUnpack() (string, error) {
	f.n.d.Kill()
	if err := f.n.restartBerthd("BERTHD_TEST_FAULTS=mid-unpack"); err != nil {
		return "", err
	}
	pullErr := f.pull(layersImage)
	select {
	case <-f.n.d.Exited():
	case <-time.After(time.Minute):
		f.n.d.Kill()
		_ = f.n.restartBerthd()
		return "", fmt.Errorf("berthd armed with mid-unpack did not exit on a pull (pull: %v)", pullErr)
	}
	exit := f.n.d.ExitErr()
	if err := f.n.restartBerthd(); err != nil {
		return "", err
	}
	var ee interface{ ExitCode() int }
	if !errors.As(exit, &ee) || ee.ExitCode() != 86 {
		return "", fmt.Errorf("berthd armed with mid-unpack exited %v, want the crash point's 86", exit)
	}
	return "crashed mid-unpack, restarted", f.pullAgainAndRemove()
}

// cniFailOnce: the next CNI ADD fails (the wrapper plugin removes the
// flag as it fails); the soak replaces a pod so that there is one. The
// kubelet retries the pod's sandbox.
func (f *faulter) cniFailOnce() (string, error) {
	if err := os.WriteFile(f.n.cniFlag, nil, 0o644); err != nil {
		return "", err
	}
	name, err := f.w.replace()
	if err != nil {
		return "", err
	}
	start := time.Now()
	for time.Since(start) < 2*time.Minute {
		if _, err := os.Stat(f.n.cniFlag); errors.Is(err, os.ErrNotExist) {
			return fmt.Sprintf("an ADD failed %s after %s was applied", time.Since(start).Round(time.Millisecond), name), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = os.Remove(f.n.cniFlag)
	return "", fmt.Errorf("no CNI ADD within 2 minutes of applying %s", name)
}

// diskFullPull: the root filled to diskFreeMiB free, then a pull of
// layersImage (more than that): it must fail cleanly (nothing left in
// ingest/, ResourceExhausted, berthd serving); then the disk is freed and
// the pull works.
func (f *faulter) diskFullPull() (string, error) {
	root := f.n.d.Root
	ballast := filepath.Join(root, "soak-ballast")
	defer os.Remove(ballast)
	if err := fillTo(root, ballast, diskFreeMiB<<20); err != nil {
		return "", err
	}
	pullErr := f.pull(layersImage)
	var finding error
	if pullErr == nil {
		// Possible only if the layers fit after all: note it.
		pullErr = errors.New("none: the pull succeeded")
		_, _ = f.n.d.Image.RemoveImage(context.Background(), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: layersImage}})
	} else {
		if left := ingestLeft(root); len(left) > 0 {
			finding = fmt.Errorf("a pull that failed on a full disk left ingest files: %v", left)
		}
		if c := status.Code(pullErr); c != codes.ResourceExhausted && c != codes.Unavailable {
			// Unavailable: berthd itself gave up on the disk (checked below).
			finding = errors.Join(finding, fmt.Errorf("a pull onto a full disk answered %s, want ResourceExhausted", c))
		}
	}
	select {
	case <-f.n.d.Exited():
		finding = errors.Join(finding, fmt.Errorf("berthd exited on a full disk: %v", f.n.d.ExitErr()))
		if err := f.n.restartBerthd(); err != nil {
			return "", errors.Join(finding, err)
		}
	default:
	}
	if err := os.Remove(ballast); err != nil {
		return "", err
	}
	note := fmt.Sprintf("pull with %d MiB free: %v", diskFreeMiB, pullErr)
	return note, errors.Join(finding, f.pullAgainAndRemove())
}

// fillTo grows ballast (below root) until root's filesystem has at most
// free bytes left: in chunks, each halved when the filesystem refuses it
// (an extent's metadata needs blocks too). Bfree, not Bavail: berthd, as
// root, may use blocks reserved for root.
func fillTo(root, ballast string, free int64) error {
	fd, err := unix.Open(ballast, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var off int64
	chunk := int64(64 << 20)
	for chunk >= 1<<20 {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err != nil {
			return err
		}
		left := int64(st.Bfree)*st.Bsize - free
		if left <= 0 {
			return nil
		}
		n := min(chunk, left)
		switch err := unix.Fallocate(fd, 0, off, n); {
		case errors.Is(err, unix.ENOSPC):
			chunk /= 2
		case err != nil:
			return fmt.Errorf("fill the root: %w", err)
		default:
			off += n
		}
	}
	return nil
}

// ingestLeft lists the files in the image store's ingest/ that are
// still there 20 s on: a failed pull's other layers are undone by their
// own streams, which may end just after the pull's reply (the
// integration tests' waitStoreEmpty allows as much).
func ingestLeft(root string) []string {
	var left []string
	waitUntil(20*time.Second, func() bool {
		left = filesBelow(filepath.Join(root, "images", "ingest"))
		return len(left) == 0
	})
	return left
}

// filesBelow lists the files (not directories) below dir.
func filesBelow(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}
