// Package diskusage measures what a directory tree occupies on disk: the
// one walk behind the image filesystem, the container filesystem and a
// container's writable layer.
package diskusage

import (
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"
)

// Usage is allocated bytes and inodes.
type Usage struct {
	Bytes  uint64
	Inodes uint64
}

// maxLinked bounds how many multiply-linked inodes one walk remembers.
// The trees measured include containers' writable layers, whose files a
// container makes at will: remembering every inode (as the walk once did)
// let a container grow berthd's memory by the file (issue 34, finding 11).
// Like du, the walk remembers only files with more than one link; past
// this many it counts each link as its share of the file (1/nlink of the
// inode and its blocks), exact when all the links are in the tree.
const maxLinked = 1 << 16

// Walk sums the allocated bytes and inodes below dir, hard links counted
// once. Directories for which skip (may be nil) returns true are not
// entered. Entries that vanish during the walk are passed over: the trees
// measured change while they are measured.
func Walk(dir string, skip func(path string) bool) (Usage, error) {
	u, _, err := walk(dir, skip, maxLinked)
	return u, err
}

type fileID struct{ dev, ino uint64 }

// walk is Walk remembering at most limit inodes; it also says how many it
// remembered.
func walk(dir string, skip func(path string) bool, limit int) (Usage, int, error) {
	var u Usage
	seen := map[fileID]struct{}{}
	// The shares of the links counted once the map is full.
	var shareInodes, shareBytes float64
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
		if !ok {
			return nil
		}
		bytes := uint64(st.Blocks) * 512
		if st.Nlink > 1 && !d.IsDir() {
			id := fileID{uint64(st.Dev), st.Ino}
			if _, dup := seen[id]; dup {
				return nil
			}
			if len(seen) >= limit {
				shareInodes += 1 / float64(st.Nlink)
				shareBytes += float64(bytes) / float64(st.Nlink)
				return nil
			}
			seen[id] = struct{}{}
		}
		u.Inodes++
		u.Bytes += bytes
		return nil
	})
	u.Inodes += uint64(math.Round(shareInodes))
	u.Bytes += uint64(math.Round(shareBytes))
	return u, len(seen), err
}
