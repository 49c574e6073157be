package server

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// housekeepingInterval is how often the shim reaps orphans (children it
// never started, reparented to it), drops waits whose clients went away
// and checks whether garbage (from attach streams) calls for a trim.
const housekeepingInterval = 5 * time.Second

// trimDelay is how long after the last request the shim gives its free
// heap back: an idle shim should hold only what it uses (PSS is the cost
// per pod), and a burst of requests should not pay for a GC each.
const trimDelay = 500 * time.Millisecond

// trimMinGarbage is how much must have been allocated since the last trim
// for another to be worth it. A shim's first GC cycle alone makes ~0.3 MiB
// of runtime metadata resident for good (span set blocks for every size
// class in use, mark bit arenas: decision 0303), more than a pod's worth of
// garbage, so the shim collects only once real garbage piled up: a pod
// with a few containers never pays for a GC, a pod whose containers keep
// restarting is bounded at ~this much garbage.
const trimMinGarbage = 256 << 10

// startHousekeeping runs housekeep every housekeepingInterval until the
// returned stop is called. A timer, not a goroutine: nothing waits.
func (s *Server) startHousekeeping() (stop func()) {
	var t *time.Timer
	t = time.AfterFunc(housekeepingInterval, func() {
		s.housekeep()
		t.Reset(housekeepingInterval)
	})
	return func() { t.Stop() }
}

// housekeep is one round of the periodic chores. It allocates nothing
// (TestHousekeepingAllocatesNothingAndDropsGoneWaits): it runs for the
// shim's whole life, and garbage would end in a GC.
func (s *Server) housekeep() {
	s.reaper.reap()
	s.dropGoneWaiters()
	s.trimNow()
}

func (s *Server) scheduleTrim() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.trim == nil {
		s.trim = time.AfterFunc(trimDelay, s.trimNow)
		return
	}
	s.trim.Reset(trimDelay)
}

// trimNow collects and returns free memory when enough garbage piled up.
// It reads the allocation counter through runtime/metrics, never
// runtime.ReadMemStats: that flushes every cached span into the central
// span sets, which allocates their blocks for each size class in use
// (~0.3 MiB that stay resident), the very cost a GC has.
func (s *Server) trimNow() {
	s.trimMu.Lock()
	defer s.trimMu.Unlock()
	allocs := s.allocs[:]
	allocs[0].Name = "/gc/heap/allocs:bytes"
	metrics.Read(allocs)
	if n := allocs[0].Value.Uint64(); n-s.trimmedAt >= trimMinGarbage {
		debug.FreeOSMemory()
		metrics.Read(allocs)
		s.trimmedAt = allocs[0].Value.Uint64()
	}
	if os.Getenv("BERTH_SHIM_MEMSTATS") != "" {
		s.logMemStats()
	}
}

// logMemStats is a debugging aid for the memory budget (decision 0303).
func (s *Server) logMemStats() {
	names := []string{"/gc/heap/allocs:bytes", "/gc/cycles/total:gc-cycles", "/sched/goroutines:goroutines"}
	for _, d := range metrics.All() {
		if strings.HasPrefix(d.Name, "/memory/classes/") {
			names = append(names, d.Name)
		}
	}
	samples := make([]metrics.Sample, len(names))
	for i, n := range names {
		samples[i].Name = n
	}
	metrics.Read(samples)
	var b strings.Builder
	b.WriteString("memstats")
	for _, sm := range samples {
		if sm.Value.Kind() == metrics.KindUint64 {
			b.WriteString(" " + sm.Name + "=" + strconv.FormatUint(sm.Value.Uint64(), 10))
		}
	}
	task, _ := os.ReadDir("/proc/self/task")
	s.logf("%s threads=%d", b.String(), len(task))
}
