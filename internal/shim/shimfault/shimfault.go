// Package shimfault is berth-shim's fault-injection hook for recovery
// tests, the shim's side of package fault (decision 0900): crash points
// at which the node's monitor or keeper kills itself with SIGKILL, as a
// bug or the OOM killer would. A package of its own, without slog, so the
// shim binary stays lean (decision 1700).
//
// berthd hands BERTH_SHIM_TEST_FAULTS from its environment to the keeper
// it starts, the keeper to every monitor it starts. It names a file that
// arms the points (point or point=N, comma-separated), read at each
// point, so a test arms them once the node's processes run; no file, no
// point armed. A point armed as point=N fires N times (once when bare),
// counted in a file in the node's dir so that a restarted monitor goes
// on counting: monitor-mid-adopt=3 is a crash loop of three.
package shimfault

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// EnvVar names the file that arms crash points.
const EnvVar = "BERTH_SHIM_TEST_FAULTS"

// Point is one named place where a shim process can be made to die.
type Point string

// The points. Each comment says what is half done when the process dies.
const (
	// MonitorMidAdopt: a restarted monitor adopted the first container
	// the keeper handed it, not the rest, and listens on no pod's socket
	// it had not adopted yet, nor on the node's.
	MonitorMidAdopt Point = "monitor-mid-adopt"
	// MonitorMidCreate: the runtime created the container and the keeper
	// holds it (the next monitor adopts it); the create is not answered.
	MonitorMidCreate Point = "monitor-mid-create"
	// MonitorMidCreateUnheld: the runtime created the container, its
	// init waits for start, but the keeper does not hold it: the next
	// monitor does not know it.
	MonitorMidCreateUnheld Point = "monitor-mid-create-unheld"
	// MonitorMidStart: the runtime started the container (its process
	// runs), the keeper was not told: it holds it as created.
	MonitorMidStart Point = "monitor-mid-start"
	// KeeperMidCreate: the keeper got a new container's register and
	// dies before it holds it: the monitor runs on without a keeper.
	KeeperMidCreate Point = "keeper-mid-create"
)

// Points lists every shim crash point.
var Points = []Point{MonitorMidAdopt, MonitorMidCreate, MonitorMidCreateUnheld, MonitorMidStart, KeeperMidCreate}

// Pause points: where a shim process, armed, sleeps (Pause) rather than
// dies. They make certain an interleaving that a loaded machine makes
// only likely.
const (
	// KeeperSlowLink: the keeper has read a message from its monitor's
	// link and not applied it yet (the goroutine that reads the link not
	// scheduled), while the monitor may go on and exit.
	KeeperSlowLink Point = "keeper-slow-link"
	// MonitorHangAdopt: a restarted monitor adopted the keeper's first
	// container and hangs (Hold) until the point is disarmed, not
	// listening on the node's socket nor serving any pod yet.
	MonitorHangAdopt Point = "monitor-hang-adopt"
)

// Pause sleeps d if p is armed in the process's environment, every time
// it is reached while the file arms it (no count: a test disarms it by
// rewriting the file). logf, if set, says so first.
func Pause(p Point, d time.Duration, logf func(string, ...any)) {
	file := os.Getenv(EnvVar)
	if file == "" {
		return
	}
	spec, err := os.ReadFile(file)
	if err != nil || armed(string(spec), p) == 0 {
		return
	}
	if logf != nil {
		logf("test fault %s: pausing %v", p, d)
	}
	time.Sleep(d)
}

// Hold blocks while p is armed in the process's environment, reading the
// file every 100 ms: a hang that lasts until the test disarms the point
// (by rewriting the file) or kills the process. logf, if set, says so
// first.
func Hold(p Point, logf func(string, ...any)) {
	file := os.Getenv(EnvVar)
	if file == "" {
		return
	}
	for said := false; ; said = true {
		spec, err := os.ReadFile(file)
		if err != nil || armed(string(spec), p) == 0 {
			return
		}
		if !said && logf != nil {
			logf("test fault %s: holding until disarmed", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Hit kills the calling process with SIGKILL if p is armed in its
// environment and has fired fewer times than armed; dir (the node's dir)
// keeps the count. logf, if set, says so first.
func Hit(p Point, dir string, logf func(string, ...any)) {
	file := os.Getenv(EnvVar)
	if file == "" {
		return
	}
	spec, err := os.ReadFile(file)
	if err != nil {
		return
	}
	times := armed(string(spec), p)
	if times == 0 {
		return
	}
	count := filepath.Join(dir, "fault-"+string(p)+".count")
	fired := 0
	if b, err := os.ReadFile(count); err == nil {
		fired, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if fired >= times {
		return
	}
	if err := os.WriteFile(count, []byte(strconv.Itoa(fired+1)), 0o600); err != nil {
		return
	}
	if logf != nil {
		logf("test fault %s (%d of %d): killing myself", p, fired+1, times)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is on its way
}

// armed is how many times v arms p (0: not at all).
func armed(v string, p Point) int {
	times := 0
	for _, f := range strings.Split(v, ",") {
		name, n, hasN := strings.Cut(strings.TrimSpace(f), "=")
		if Point(name) != p {
			continue
		}
		times = 1
		if hasN {
			times, _ = strconv.Atoi(n)
		}
	}
	return times
}

// Arm writes the file that arms p (times times, once when not given).
func Arm(file string, p Point, times ...int) error {
	spec := string(p)
	if len(times) > 0 {
		spec = fmt.Sprintf("%s=%d", p, times[0])
	}
	return os.WriteFile(file, []byte(spec), 0o644)
}
