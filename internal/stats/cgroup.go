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

	"github.com/containerd/cgroups/v3"
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

// Read returns the usage of the cgroup at group (a path below the
// hierarchy roots, from GroupPath), on whichever cgroup version the host
// runs. A missing cgroup is ErrNotFound.
func Read(group string) (*Usage, error) {
	if cgroups.Mode() == cgroups.Unified {
		return ReadV2("/sys/fs/cgroup", group)
	}
	return ReadV1(group)
}

// ReadV1 reads a cgroup v1 group through the mounted controllers.
func ReadV1(group string) (*Usage, error) {
	cg, err := cgroup1.Load(cgroup1.StaticPath(group))
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
	return fromV1(m), nil
}

func fromV1(m *v1stats.Metrics) *Usage {
	u := &Usage{Timestamp: time.Now()}
	if m.CPU != nil && m.CPU.Usage != nil {
		u.CPUUsageNanos = m.CPU.Usage.Total
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
	}
	if m.Pids != nil {
		u.Processes = m.Pids.Current
	}
	return u
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
	return fromV2(m), nil
}

func fromV2(m *v2stats.Metrics) *Usage {
	u := &Usage{Timestamp: time.Now()}
	if m.CPU != nil {
		u.CPUUsageNanos = m.CPU.UsageUsec * 1000
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
	}
	if m.Pids != nil {
		u.Processes = m.Pids.Current
	}
	return u
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
