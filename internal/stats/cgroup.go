// Package stats reads container and pod resource usage from cgroups (v1
// and v2, through github.com/containerd/cgroups/v3), network counters from
// a pod's network namespace, and writable-layer usage from disk, in the
// shapes the CRI stats RPCs return.
package stats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	v1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	"github.com/containerd/cgroups/v3/cgroup2"
	v2stats "github.com/containerd/cgroups/v3/cgroup2/stats"

	"github.com/berthcri/berth/internal/errdefs"
)

// Usage is one cgroup's resource usage at one moment.
type Usage struct {
	Timestamp time.Time
	// CPUUsageNanos is cumulative CPU time over all cores.
	CPUUsageNanos uint64
	// MemoryUsage is the cgroup's charged memory, page cache included.
	MemoryUsage uint64
	// WorkingSet is usage minus inactive file pages: what the kubelet
	// evicts on, as cAdvisor computes it.
	WorkingSet      uint64
	RSS             uint64
	PageFaults      uint64
	MajorPageFaults uint64
	// MemoryLimit is 0 when the cgroup has no limit.
	MemoryLimit uint64
	Processes   uint64
	SwapUsage   uint64

	// CPU split and CFS bandwidth throttling (cpuacct.stat and cpu.stat on
	// v1, cpu.stat on v2).
	CPUUserNanos, CPUSystemNanos    uint64
	CFSPeriods, CFSThrottledPeriods uint64
	CFSThrottledNanos               uint64

	// Memory detail: page cache, mapped files, kernel memory, the peak
	// usage (v2: memory.peak, 0 before kernel 5.19), times the limit was
	// hit (v1 failcnt, v2 memory.events "max") and OOM kills.
	MemoryCache, MemoryMappedFile, MemoryKernel uint64
	MemoryMaxUsage, MemoryFailcnt, OOMKills     uint64
	// OwnPageFaults and OwnMajorPageFaults count this cgroup alone; v1
	// keeps them apart from the hierarchical totals above, v2 does not.
	OwnPageFaults, OwnMajorPageFaults uint64

	// ThreadsMax is the pids limit (0: unlimited).
	ThreadsMax uint64
	// Threads, FileDescriptors and Sockets are counted in /proc over the
	// cgroup's processes.
	Threads, FileDescriptors, Sockets uint64

	// IO is block I/O by device (v1 blkio throttle stats, v2 io.stat);
	// empty when the cgroup did no block I/O.
	IO []DeviceIO

	// CPUPressure, MemoryPressure and IOPressure are the cgroup's pressure
	// stall information (v2 cpu.pressure, memory.pressure, io.pressure).
	// nil where the kernel exposes none (cgroup v1, or PSI disabled):
	// unknown, which is not "no pressure".
	CPUPressure, MemoryPressure, IOPressure *Pressure
}

// Pressure is one resource's PSI. Some is the time at least one task of
// the cgroup stalled on it, Full the time all of them did (nil when the
// kernel reports no "full" line, as for CPU before 5.13).
type Pressure struct {
	Some, Full *PSI
}

// PSI is one line of a *.pressure file.
type PSI struct {
	// TotalNanos is the cumulative stall time (the file's "total" is in
	// microseconds).
	TotalNanos uint64
	// Avg10, Avg60 and Avg300 are the percentage of time stalled over the
	// last 10, 60 and 300 seconds.
	Avg10, Avg60, Avg300 float64
}

func pressureFromV2(p *v2stats.PSIStats) *Pressure {
	if p == nil || (p.Some == nil && p.Full == nil) {
		return nil
	}
	line := func(d *v2stats.PSIData) *PSI {
		if d == nil {
			return nil
		}
		return &PSI{TotalNanos: d.Total * 1000, Avg10: d.Avg10, Avg60: d.Avg60, Avg300: d.Avg300}
	}
	return &Pressure{Some: line(p.Some), Full: line(p.Full)}
}

// DeviceIO is a cgroup's block I/O on one device.
type DeviceIO struct {
	// Device is the /dev path when known, else "major:minor".
	Device                string
	Major, Minor          uint64
	ReadBytes, WriteBytes uint64
	Reads, Writes         uint64
}

// AvailableBytes is the memory left before the limit (0 when unlimited).
func (u *Usage) AvailableBytes() uint64 {
	if u.MemoryLimit == 0 || u.WorkingSet >= u.MemoryLimit {
		return 0
	}
	return u.MemoryLimit - u.WorkingSet
}

// unlimited is what v1 reports as the limit of an unlimited cgroup, rounded
// to a page; anything at or above it means no limit.
const unlimited = uint64(1) << 62

// GroupPath turns a cgroupsPath as written in an OCI spec into the cgroup's
// path below a hierarchy root: cgroupfs paths pass through; systemd's
// "slice:prefix:name" expands to the nested slice directories systemd
// creates ("a-b.slice" lives in "a.slice/a-b.slice").
func GroupPath(cgroupsPath string) (string, error) {
	parts := strings.Split(cgroupsPath, ":")
	if len(parts) != 3 {
		if !strings.HasPrefix(cgroupsPath, "/") {
			return "", fmt.Errorf("cgroup path %q: want an absolute path or slice:prefix:name: %w", cgroupsPath, errdefs.ErrInvalidArgument)
		}
		return filepath.Clean(cgroupsPath), nil
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	dir, err := ExpandSlice(slice)
	if err != nil {
		return "", err
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		unit = prefix + "-" + name + ".scope"
		if prefix == "" {
			unit = name + ".scope"
		}
	}
	return filepath.Join(dir, unit), nil
}

// ExpandSlice turns "a-b-c.slice" into "/a.slice/a-b.slice/a-b-c.slice".
func ExpandSlice(slice string) (string, error) {
	if slice == "" || slice == "-.slice" {
		return "/", nil
	}
	name, ok := strings.CutSuffix(slice, ".slice")
	if !ok || strings.Contains(name, "/") || strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-") || strings.Contains(name, "--") {
		return "", fmt.Errorf("invalid systemd slice %q: %w", slice, errdefs.ErrInvalidArgument)
	}
	path := ""
	prefix := ""
	for _, comp := range strings.Split(name, "-") {
		prefix += comp
		path += "/" + prefix + ".slice"
		prefix += "-"
	}
	return path, nil
}

// ReadV1 reads a cgroup v1 group through the mounted controllers.
func ReadV1(group string) (*Usage, error) {
	cg, err := cgroup1.Load(v1Path(group))
	if err != nil {
		if errors.Is(err, cgroup1.ErrCgroupDeleted) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("load cgroup %s: %w", group, err)
	}
	m, err := cg.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return nil, fmt.Errorf("stat cgroup %s: %w", group, err)
	}
	u := fromV1(m)
	procs, err := cg.Processes(cgroup1.Pids, true)
	if err != nil {
		procs, err = cg.Processes(cgroup1.Memory, true)
	}
	if err != nil {
		return nil, procsError(group, err)
	}
	pids := make([]int, 0, len(procs))
	for _, p := range procs {
		pids = append(pids, p.Pid)
	}
	u.Threads, u.FileDescriptors, u.Sockets = ProcessCounts("/proc", pids)
	return u, nil
}

func fromV1(m *v1stats.Metrics) *Usage {
	u := &Usage{Timestamp: time.Now()}
	if m.CPU != nil && m.CPU.Usage != nil {
		u.CPUUsageNanos = m.CPU.Usage.Total
		u.CPUUserNanos, u.CPUSystemNanos = m.CPU.Usage.User, m.CPU.Usage.Kernel
	}
	if m.CPU != nil && m.CPU.Throttling != nil {
		t := m.CPU.Throttling
		u.CFSPeriods, u.CFSThrottledPeriods, u.CFSThrottledNanos = t.Periods, t.ThrottledPeriods, t.ThrottledTime
	}
	if mem := m.Memory; mem != nil {
		if mem.Usage != nil {
			u.MemoryUsage = mem.Usage.Usage
			if mem.Usage.Limit < unlimited {
				u.MemoryLimit = mem.Usage.Limit
			}
		}
		if mem.Swap != nil && mem.Usage != nil && mem.Swap.Usage > mem.Usage.Usage {
			u.SwapUsage = mem.Swap.Usage - mem.Usage.Usage
		}
		u.WorkingSet = sub(u.MemoryUsage, mem.TotalInactiveFile)
		u.RSS = mem.TotalRSS
		u.PageFaults = mem.TotalPgFault
		u.MajorPageFaults = mem.TotalPgMajFault
		u.OwnPageFaults, u.OwnMajorPageFaults = mem.PgFault, mem.PgMajFault
		u.MemoryCache, u.MemoryMappedFile = mem.TotalCache, mem.TotalMappedFile
		if mem.Usage != nil {
			u.MemoryMaxUsage, u.MemoryFailcnt = mem.Usage.Max, mem.Usage.Failcnt
		}
		if mem.Kernel != nil {
			u.MemoryKernel = mem.Kernel.Usage
		}
	}
	if m.MemoryOomControl != nil {
		u.OOMKills = m.MemoryOomControl.OomKill
	}
	if m.Pids != nil {
		u.Processes, u.ThreadsMax = m.Pids.Current, m.Pids.Limit
	}
	if b := m.Blkio; b != nil {
		u.IO = blkioV1(b.IoServiceBytesRecursive, b.IoServicedRecursive)
	}
	return u
}

// blkioV1 merges v1's per-operation byte and count entries by device.
func blkioV1(bytes, ops []*v1stats.BlkIOEntry) []DeviceIO {
	var out []DeviceIO
	at := map[[2]uint64]int{}
	get := func(e *v1stats.BlkIOEntry) *DeviceIO {
		k := [2]uint64{e.Major, e.Minor}
		i, ok := at[k]
		if !ok {
			dev := e.Device
			if dev == "" {
				dev = fmt.Sprintf("%d:%d", e.Major, e.Minor)
			}
			i = len(out)
			at[k] = i
			out = append(out, DeviceIO{Device: dev, Major: e.Major, Minor: e.Minor})
		}
		return &out[i]
	}
	for _, e := range bytes {
		switch strings.ToLower(e.Op) {
		case "read":
			get(e).ReadBytes = e.Value
		case "write":
			get(e).WriteBytes = e.Value
		}
	}
	for _, e := range ops {
		switch strings.ToLower(e.Op) {
		case "read":
			get(e).Reads = e.Value
		case "write":
			get(e).Writes = e.Value
		}
	}
	return out
}

// ReadV2 reads a cgroup v2 group below mountpoint (the unified hierarchy's
// root; tests point it at a fixture tree).
func ReadV2(mountpoint, group string) (*Usage, error) {
	if _, err := os.Stat(filepath.Join(mountpoint, group)); err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("cgroup %s: %w", group, err)
	}
	mgr, err := cgroup2.Load(group, cgroup2.WithMountpoint(mountpoint))
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", group, err)
	}
	m, err := mgr.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat cgroup %s: %w", group, err)
	}
	u := fromV2(m)
	// memory.stat's "kernel" (5.18+) is every kernel allocation; the
	// library does not parse it, and its parts (stack, slab, sock) are
	// only a lower bound on older kernels.
	if k, ok := statKey(filepath.Join(mountpoint, group, "memory.stat"), "kernel"); ok {
		u.MemoryKernel = k
	}
	for i := range u.IO {
		u.IO[i].Device = blockDevice(u.IO[i].Major, u.IO[i].Minor)
	}
	pids, err := mgr.Procs(true)
	if err != nil {
		return nil, procsError(group, err)
	}
	ints := make([]int, 0, len(pids))
	for _, p := range pids {
		ints = append(ints, int(p))
	}
	u.Threads, u.FileDescriptors, u.Sockets = ProcessCounts("/proc", ints)
	return u, nil
}

func fromV2(m *v2stats.Metrics) *Usage {
	u := &Usage{Timestamp: time.Now()}
	if c := m.CPU; c != nil {
		u.CPUUsageNanos = c.UsageUsec * 1000
		u.CPUUserNanos, u.CPUSystemNanos = c.UserUsec*1000, c.SystemUsec*1000
		u.CFSPeriods, u.CFSThrottledPeriods, u.CFSThrottledNanos = c.NrPeriods, c.NrThrottled, c.ThrottledUsec*1000
		u.CPUPressure = pressureFromV2(c.PSI)
	}
	if mem := m.Memory; mem != nil {
		u.MemoryUsage = mem.Usage
		if mem.UsageLimit < unlimited {
			u.MemoryLimit = mem.UsageLimit
		}
		u.WorkingSet = sub(mem.Usage, mem.InactiveFile)
		u.RSS = mem.Anon
		u.PageFaults = mem.Pgfault
		u.MajorPageFaults = mem.Pgmajfault
		u.SwapUsage = mem.SwapUsage
		u.OwnPageFaults, u.OwnMajorPageFaults = mem.Pgfault, mem.Pgmajfault
		u.MemoryCache, u.MemoryMappedFile = mem.File, mem.FileMapped
		u.MemoryKernel = mem.KernelStack + mem.Slab + mem.Sock
		u.MemoryMaxUsage = mem.MaxUsage
		u.MemoryPressure = pressureFromV2(mem.PSI)
	}
	if ev := m.MemoryEvents; ev != nil {
		// v2 has no failcnt; "max" counts the times usage hit memory.max,
		// which is what failcnt counted on v1.
		u.MemoryFailcnt, u.OOMKills = ev.Max, ev.OomKill
	}
	if m.Pids != nil {
		u.Processes, u.ThreadsMax = m.Pids.Current, m.Pids.Limit
	}
	if m.Io != nil {
		u.IOPressure = pressureFromV2(m.Io.PSI)
		for _, e := range m.Io.Usage {
			u.IO = append(u.IO, DeviceIO{Major: e.Major, Minor: e.Minor, ReadBytes: e.Rbytes, WriteBytes: e.Wbytes, Reads: e.Rios, Writes: e.Wios})
		}
	}
	return u
}

// procsError reports a failed listing of a cgroup's processes; a cgroup
// removed since its stats were read (the container exited) is NotFound,
// like one missing from the start.
func procsError(group string, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return fmt.Errorf("processes of cgroup %s: %w", group, errdefs.ErrNotFound)
	}
	return fmt.Errorf("processes of cgroup %s: %w", group, err)
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// v1Path places group in each v1 hierarchy: at group itself where that
// exists (cgroupfs-driver cgroups, and systemd's on a normal host), else
// where systemd's root in that hierarchy puts it (systemd in a container
// rooted differently per controller).
func v1Path(group string) cgroup1.Path {
	var roots map[string]string
	return func(n cgroup1.Name) (string, error) {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", string(n), group)); err == nil {
			return group, nil
		}
		if roots == nil {
			data, _ := os.ReadFile("/proc/1/cgroup")
			roots = initRoots(data)
		}
		if p, ok := systemdV1Path(group, string(n), roots); ok {
			return p, nil
		}
		return group, nil
	}
}
