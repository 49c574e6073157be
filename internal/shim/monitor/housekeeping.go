package monitor

import (
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/textpages"
)

// housekeepingInterval is how often the monitor reaps orphans (children it
// never started, reparented to it), drops waits whose clients went away
// and checks whether its memory grew enough to call for a trim.
const housekeepingInterval = 5 * time.Second

// trimDelay is how long after the last request the monitor gives its free
// heap back: an idle monitor should hold only what it uses (its PSS,
// shared by the node's pods, is what it costs), and a burst of requests should not pay for a GC each.
const trimDelay = 500 * time.Millisecond

// trimMinGrowth is how much the monitor's anonymous resident memory must have
// grown since the last trim (or since Listen, before any container) for a
// trim to be worth it. The monitor's first GC cycle alone makes ~0.3 MiB of runtime
// metadata resident for good (span set blocks for every size class in use,
// mark bit arenas: decision 0303), more than a pod's worth of garbage, so
// the monitor collects only once real growth piled up: a pod with a few
// containers never pays for a GC, a pod whose containers keep restarting is
// bounded at ~this much garbage. Growth, not allocation, is the measure
// (decision 1700): garbage that lands in pages already resident costs
// nothing, and reading the kernel's counter keeps runtime/metrics (and the
// ~30-60 KiB its tables make resident) out of the monitor.
const trimMinGrowth = 256 << 10

// firstTrimMinGrowth is trimMinGrowth for the monitor's first collection,
// which alone makes ~0.25-0.3 MiB of runtime metadata resident for good:
// it pays only once more garbage than that can have piled up. Growth is
// not all garbage (a container's goroutines, buffers and state are
// ~20-40 KiB of it), and at 256 KiB one pod of three containers
// collected right after its creates and ended ~150 KiB above where it
// ends without that collection (decision 3100).
const firstTrimMinGrowth = 2 * trimMinGrowth

// startHousekeeping runs housekeep every housekeepingInterval until the
// returned stop is called. A timer, not a goroutine: nothing waits.
func (m *Monitor) startHousekeeping() (stop func()) {
	var t *time.Timer
	t = time.AfterFunc(housekeepingInterval, func() {
		m.housekeep()
		t.Reset(housekeepingInterval)
	})
	return func() { t.Stop() }
}

// housekeep is one round of the periodic chores. It allocates nothing
// (TestHousekeepingAllocatesNothingAndDropsGoneWaits): it runs for the
// monitor's whole life, and garbage would end in a GC.
func (m *Monitor) housekeep() {
	m.reaper.reap()
	m.eachPod((*Pod).dropGoneWaiters)
	m.keeper.checkAlive()
	m.mu.Lock()
	// Once it had pods or lazy layers, losing the last closed it already
	// (podGone, forgetLazy): only a node that never got one is left to
	// time out.
	if m.idleLocked() && time.Since(m.started) > idleExitAfter {
		m.closeLocked("idle")
	}
	m.mu.Unlock()
	m.trimNow()
}

func (m *Monitor) scheduleTrim() {
	m.trimMu.Lock()
	defer m.trimMu.Unlock()
	if m.trim == nil {
		m.trim = time.AfterFunc(trimDelay, m.trimNow)
		return
	}
	m.trim.Reset(trimDelay)
}

// trimNow collects and returns free memory when the monitor's anonymous
// resident memory grew by trimMinGrowth (firstTrimMinGrowth before its
// first collection) since the last trim, or since
// Listen (which takes the baseline before any container; without it the
// first call does). It never calls runtime.ReadMemStats: that
// flushes every cached span into the central span sets, which allocates
// their blocks for each size class in use (~0.3 MiB that stay resident),
// the very cost a GC has. Each call also unmaps the binary's pages the
// monitor ran since the last (textpages.Release, decision 3100).
func (m *Monitor) trimNow() {
	m.trimMu.Lock()
	defer m.trimMu.Unlock()
	need := uint64(firstTrimMinGrowth)
	if m.collected {
		need = trimMinGrowth
	}
	anon, ok := m.statm.anonResident()
	if ok {
		switch {
		case m.trimmedAt == 0:
			m.trimmedAt = anon
		case anon >= m.trimmedAt+need:
			debug.FreeOSMemory()
			m.collected = true
			if anon, ok = m.statm.anonResident(); ok {
				m.trimmedAt = anon
			}
		}
	}
	// The pages of the binary that the create path, adoption or start
	// ran stay mapped until dropped; what the monitor runs from here on
	// (its log path) maps its own back (decision 3100).
	textpages.Release()
	if os.Getenv("BERTH_SHIM_MEMSTATS") != "" {
		m.logMemStats(anon)
	}
}

// statm reads the process's resident memory from /proc/self/statm. The
// file is opened on first use and kept (re-read with pread at offset 0):
// opening it by name each time would allocate.
type statm struct {
	opened bool
	fd     int // -1: cannot be opened
	buf    [128]byte
}

// open opens the file once; Listen's first read opens it, so that the
// monitor's fds are all open by the time it serves.
func (m *statm) open() {
	if m.opened {
		return
	}
	fd, err := unix.Open("/proc/self/statm", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fd = -1
	}
	m.fd, m.opened = fd, true
}

// anonResident returns the anonymous resident memory in bytes: resident
// minus shared (file-backed and shmem) pages.
func (m *statm) anonResident() (uint64, bool) {
	m.open()
	if m.fd < 0 {
		return 0, false
	}
	n, err := unix.Pread(m.fd, m.buf[:], 0)
	if err != nil || n <= 0 {
		return 0, false
	}
	return parseStatm(m.buf[:n])
}

// parseStatm reads "size resident shared text lib data dt" (pages) and
// returns (resident - shared) in bytes.
func parseStatm(b []byte) (uint64, bool) {
	var fields [3]uint64
	i := 0
	for f := range fields {
		for i < len(b) && b[i] == ' ' {
			i++
		}
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			fields[f] = fields[f]*10 + uint64(b[i]-'0')
			i++
		}
		if i == start {
			return 0, false
		}
	}
	resident, shared := fields[1], fields[2]
	if shared > resident {
		return 0, false
	}
	return (resident - shared) * uint64(unix.Getpagesize()), true
}

// logMemStats is a debugging aid for the memory budget (decisions 0303,
// 1700). It reads nothing from the runtime that would change what it
// measures; hack/go-heap-spans.py (gdb) splits a live monitor's heap by size
// class and stack.
func (m *Monitor) logMemStats(anon uint64) {
	task, _ := os.ReadDir("/proc/self/task")
	m.logf("memstats anon_resident_kib=%d threads=%d goroutines=%d", anon>>10, len(task), runtime.NumGoroutine())
}
