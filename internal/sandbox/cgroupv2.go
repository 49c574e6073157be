package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/errdefs"
)

// cgroupFile is one value to write to a cgroup v2 file.
type cgroupFile struct {
	name, value string
	// optional: a missing file is fine (memory.swap.max "0" or "max" on a
	// host without swap accounting, as runc does).
	optional bool
}

// v2Files converts runtime-spec limits into cgroup v2 files the way runc's
// fs2 manager does, so a pod cgroup gets what a container cgroup would for
// the same values: cpu.weight from shares, cpu.max ("max" for no quota),
// memory.swap.max as swap beyond the memory limit, "max" for -1, pids,
// hugetlb, and the unified map last, overriding the rest.
func v2Files(res *specs.LinuxResources) ([]cgroupFile, error) {
	var out []cgroupFile
	if c := res.CPU; c != nil {
		if c.Shares != nil && *c.Shares != 0 {
			out = append(out, cgroupFile{name: "cpu.weight", value: strconv.FormatUint(cgroupplan.CPUWeightFromShares(*c.Shares), 10)})
		}
		var quota int64
		var period uint64
		if c.Quota != nil {
			quota = *c.Quota
		}
		if c.Period != nil {
			period = *c.Period
		}
		if quota != 0 || period != 0 {
			v := "max"
			if quota > 0 {
				v = strconv.FormatInt(quota, 10)
			}
			if period != 0 {
				v += " " + strconv.FormatUint(period, 10)
			}
			out = append(out, cgroupFile{name: "cpu.max", value: v})
		}
		if c.Cpus != "" {
			out = append(out, cgroupFile{name: "cpuset.cpus", value: c.Cpus})
		}
		if c.Mems != "" {
			out = append(out, cgroupFile{name: "cpuset.mems", value: c.Mems})
		}
	}
	if m := res.Memory; m != nil {
		var limit, swap int64
		if m.Limit != nil {
			limit = *m.Limit
		}
		if m.Swap != nil {
			swap = *m.Swap
		}
		v2swap, err := swapV2(swap, limit)
		if err != nil {
			return nil, err
		}
		switch {
		case v2swap == -1:
			out = append(out, cgroupFile{name: "memory.swap.max", value: "max", optional: true})
		case v2swap > 0:
			out = append(out, cgroupFile{name: "memory.swap.max", value: strconv.FormatInt(v2swap, 10)})
		case swap > 0:
			// swap == limit: no swap.
			out = append(out, cgroupFile{name: "memory.swap.max", value: "0", optional: true})
		}
		if limit != 0 {
			out = append(out, cgroupFile{name: "memory.max", value: maxOr(limit)})
		}
		if m.Reservation != nil && *m.Reservation != 0 {
			out = append(out, cgroupFile{name: "memory.low", value: maxOr(*m.Reservation)})
		}
	}
	if p := res.Pids; p != nil && p.Limit != nil && *p.Limit != 0 {
		out = append(out, cgroupFile{name: "pids.max", value: maxOr(*p.Limit)})
	}
	for _, h := range res.HugepageLimits {
		out = append(out, cgroupFile{name: "hugetlb." + h.Pagesize + ".max", value: strconv.FormatUint(h.Limit, 10)})
	}
	keys := make([]string, 0, len(res.Unified))
	for k := range res.Unified {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "" || k == "." || k == ".." || filepath.Base(k) != k {
			return nil, fmt.Errorf("unified key %q: %w", k, errdefs.ErrInvalidArgument)
		}
		out = append(out, cgroupFile{name: k, value: res.Unified[k]})
	}
	return out, nil
}

// swapV2 turns the runtime-spec's memory+swap limit into cgroup v2's swap
// limit (runc's ConvertMemorySwapToCgroupV2Value): -1 is "max", 0 unset.
func swapV2(swap, limit int64) (int64, error) {
	if limit == -1 && swap == 0 {
		return -1, nil
	}
	if swap == -1 || swap == 0 {
		return swap, nil
	}
	if limit == 0 || limit == -1 {
		return 0, fmt.Errorf("memory swap limit %d without a memory limit: %w", swap, errdefs.ErrInvalidArgument)
	}
	if swap < limit {
		return 0, fmt.Errorf("memory+swap limit %d below the memory limit %d: %w", swap, limit, errdefs.ErrInvalidArgument)
	}
	return swap - limit, nil
}

func maxOr(v int64) string {
	if v < 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// writeV2 writes res to the cgroup v2 directory dir. Files are opened
// without O_CREAT: a limit whose controller the cgroup lacks fails,
// naming the file, except the optional ones.
func writeV2(dir string, res *specs.LinuxResources) error {
	files, err := v2Files(res)
	if err != nil {
		return err
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		err := writeExisting(p, f.value)
		if err != nil && f.optional && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write %q to %s: %w", f.value, p, err)
		}
	}
	return nil
}

func writeExisting(path, value string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
