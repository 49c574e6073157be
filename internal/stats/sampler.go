package stats

import (
	"sync"
	"time"
)

// CPURate turns cumulative CPU usage into nano-cores (CPU nanoseconds per
// wall-clock second) by remembering each object's previous sample, as the
// kubelet expects usage_nano_cores to be computed.
type CPURate struct {
	mu   sync.Mutex
	last map[string]cpuSample
}

type cpuSample struct {
	at    time.Time
	usage uint64
}

// NewCPURate returns an empty rate tracker.
func NewCPURate() *CPURate { return &CPURate{last: map[string]cpuSample{}} }

// NanoCores records (at, usage) for id and returns the rate since id's
// previous sample; 0 on the first sample or when the counter went back.
func (r *CPURate) NanoCores(id string, at time.Time, usage uint64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, ok := r.last[id]
	r.last[id] = cpuSample{at: at, usage: usage}
	if !ok || !at.After(prev.at) || usage < prev.usage {
		return 0
	}
	return uint64(float64(usage-prev.usage) / float64(at.Sub(prev.at).Nanoseconds()) * 1e9)
}

// Forget drops id's history, when its object is removed.
func (r *CPURate) Forget(id string) {
	r.mu.Lock()
	delete(r.last, id)
	r.mu.Unlock()
}
