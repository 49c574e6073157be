package container

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/moby/sys/mountinfo"
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
	seen := map[uint64]bool{}
	err = filepath.WalkDir(s.opts.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// Containers come and go during the walk.
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.IsDir() && skip[p] {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || seen[st.Ino] {
			return nil
		}
		seen[st.Ino] = true
		u.Inodes++
		u.Bytes += uint64(st.Blocks) * 512
		return nil
	})
	if err != nil {
		return u, fmt.Errorf("measure %s: %w", s.opts.Dir, err)
	}
	return u, nil
}
