package stats

import (
	"io/fs"
	"path/filepath"
	"syscall"
)

// DirUsage walks dir (a container's writable layer) and returns the bytes
// of disk its files occupy and the number of inodes, counting hard links
// once.
func DirUsage(dir string) (bytes, inodes uint64, err error) {
	seen := map[uint64]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if seen[st.Ino] {
			return nil
		}
		seen[st.Ino] = true
		inodes++
		bytes += uint64(st.Blocks) * 512
		return nil
	})
	return bytes, inodes, err
}
