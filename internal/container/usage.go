package container

import (
	"fmt"

	"github.com/moby/sys/mountinfo"

	"github.com/berthcri/berth/internal/diskusage"
)

// Dir is where containers live (<root>/containers): their records, specs
// and writable layers (upper and work dirs). It is the container
// filesystem of ImageFsInfo (KEP-4191), which may be a mount of its own.
func (s *Store) Dir() string { return s.opts.Dir }

// DiskUsage is what the containers directory occupies.
type DiskUsage struct {
	Bytes  uint64
	Inodes uint64
}

// DiskUsage sums the allocated bytes and inodes below Dir (hard links
// counted once) without entering mounts: rootfs overlays and image
// volumes show the image layers, which belong to the image filesystem,
// and idmapped copies of them as well.
func (s *Store) DiskUsage() (DiskUsage, error) {
	var u DiskUsage
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(s.opts.Dir))
	if err != nil {
		return u, fmt.Errorf("list mounts below %s: %w", s.opts.Dir, err)
	}
	skip := make(map[string]bool, len(mounts))
	for _, m := range mounts {
		if m.Mountpoint != s.opts.Dir {
			skip[m.Mountpoint] = true
		}
	}
	du, err := diskusage.Walk(s.opts.Dir, func(p string) bool { return skip[p] })
	if err != nil {
		return u, fmt.Errorf("measure %s: %w", s.opts.Dir, err)
	}
	return DiskUsage(du), nil
}
