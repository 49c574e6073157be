// Package diskusage measures what a directory tree occupies on disk: the
// one walk behind the image filesystem, the container filesystem and a
// container's writable layer.
package diskusage

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Usage is allocated bytes and inodes.
type Usage struct {
	Bytes  uint64
	Inodes uint64
}

// Walk sums the allocated bytes and inodes below dir, hard links counted
// once. Directories for which skip (may be nil) returns true are not
// entered. Entries that vanish during the walk are passed over: the trees
// measured change while they are measured.
func Walk(dir string, skip func(path string) bool) (Usage, error) {
	var u Usage
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if d.IsDir() && skip != nil && skip(p) {
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
	return u, err
}
