package systemd

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/errdefs"
)

func prop(name string, v any) sddbus.Property {
	return sddbus.Property{Name: name, Value: godbus.MakeVariant(v)}
}

// PodSliceProperties are the properties a pod slice starts with. The
// accounting switches make systemd create the slice in the cpu, cpuacct,
// memory, pids and blkio hierarchies on cgroup v1 (it realises only the
// controllers some unit asks for), so stats and limits find it there.
// DefaultDependencies=no keeps the slice out of shutdown.target's
// ordering, as runc does for the slices it makes.
func PodSliceProperties(podID string, v2 bool) []sddbus.Property {
	io := "BlockIOAccounting"
	if v2 {
		io = "IOAccounting"
	}
	return []sddbus.Property{
		sddbus.PropDescription("berth pod " + podID),
		prop("DefaultDependencies", false),
		prop("CPUAccounting", true),
		prop("MemoryAccounting", true),
		prop("TasksAccounting", true),
		prop(io, true),
	}
}

// defaultCPUPeriod is the kernel's CFS period when none is given (µs).
const defaultCPUPeriod = 100000

// ResourceProperties turns pod-level limits into the unit properties
// systemd applies to a slice's cgroup. The second result lists what has
// no property on this cgroup version (hugepages, unified keys, v1 cpuset
// and swap): the caller decides what to do about those.
func ResourceProperties(res *specs.LinuxResources, v2 bool) ([]sddbus.Property, []string, error) {
	var props []sddbus.Property
	var left []string
	if res == nil {
		return nil, nil, nil
	}
	if c := res.CPU; c != nil {
		if c.Shares != nil && *c.Shares != 0 {
			if v2 {
				props = append(props, prop("CPUWeight", cgroupplan.CPUWeightFromShares(*c.Shares)))
			} else {
				props = append(props, prop("CPUShares", *c.Shares))
			}
		}
		period := uint64(defaultCPUPeriod)
		if c.Period != nil && *c.Period != 0 {
			period = *c.Period
			props = append(props, prop("CPUQuotaPeriodUSec", period))
		}
		if c.Quota != nil && *c.Quota != 0 {
			props = append(props, prop("CPUQuotaPerSecUSec", quotaPerSec(*c.Quota, period)))
		}
		if c.Cpus != "" || c.Mems != "" {
			if !v2 {
				left = append(left, "cpuset")
			} else {
				for name, list := range map[string]string{"AllowedCPUs": c.Cpus, "AllowedMemoryNodes": c.Mems} {
					if list == "" {
						continue
					}
					mask, err := listToMask(list)
					if err != nil {
						return nil, nil, err
					}
					props = append(props, prop(name, mask))
				}
			}
		}
	}
	if m := res.Memory; m != nil {
		if m.Limit != nil && *m.Limit != 0 {
			name := "MemoryLimit"
			if v2 {
				name = "MemoryMax"
			}
			props = append(props, prop(name, limitValue(*m.Limit)))
		}
		if m.Swap != nil && *m.Swap != 0 {
			switch {
			case !v2 && (m.Limit == nil || *m.Swap != *m.Limit):
				// swap == limit (no swap) is what the kubelet sends.
				left = append(left, "memory swap")
			case !v2:
			case *m.Swap == -1:
				props = append(props, prop("MemorySwapMax", uint64(math.MaxUint64)))
			case m.Limit != nil && *m.Limit > 0 && *m.Swap >= *m.Limit:
				// runtime-spec swap is memory+swap; systemd's is swap alone.
				props = append(props, prop("MemorySwapMax", uint64(*m.Swap-*m.Limit)))
			}
		}
	}
	if p := res.Pids; p != nil && p.Limit != nil && *p.Limit != 0 {
		props = append(props, prop("TasksMax", limitValue(*p.Limit)))
	}
	if len(res.HugepageLimits) > 0 {
		left = append(left, "hugepages")
	}
	if len(res.Unified) > 0 {
		left = append(left, "unified")
	}
	return props, left, nil
}

// limitValue maps the spec's -1 (no limit) to systemd's infinity.
func limitValue(v int64) uint64 {
	if v < 0 {
		return math.MaxUint64
	}
	return uint64(v)
}

// quotaPerSec turns a CFS quota per period into systemd's CPU time per
// second, rounded up to the 10 ms steps systemd keeps (rounding down
// would throttle a pod below its limit). -1 is no limit.
func quotaPerSec(quota int64, period uint64) uint64 {
	if quota < 0 || period == 0 {
		return math.MaxUint64
	}
	v := uint64(quota) * 1000000 / period
	if r := v % 10000; r != 0 {
		v += 10000 - r
	}
	return v
}

// listToMask turns a cpuset list ("0-3,8") into systemd's byte mask: bit
// n%8 of byte n/8 stands for CPU (or node) n.
func listToMask(list string) ([]byte, error) {
	var mask []byte
	set := func(n int) {
		for len(mask) <= n/8 {
			mask = append(mask, 0)
		}
		mask[n/8] |= 1 << (n % 8)
	}
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b > 8191 {
			return nil, fmt.Errorf("cpuset list %q: %w", list, errdefs.ErrInvalidArgument)
		}
		for n := a; n <= b; n++ {
			set(n)
		}
	}
	return mask, nil
}
