package stats

import "github.com/berthcri/berth/internal/diskusage"

// DirUsage walks dir (a container's writable layer) and returns the bytes
// of disk its files occupy and the number of inodes, counting hard links
// once.
func DirUsage(dir string) (bytes, inodes uint64, err error) {
	u, err := diskusage.Walk(dir, nil)
	return u.Bytes, u.Inodes, err
}
