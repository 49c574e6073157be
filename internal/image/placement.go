package image

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// fsTopDirFlag is FS_TOPDIR_FL (linux/fs.h, chattr +T), which x/sys does
// not define: ext2/3/4's Orlov allocator places each subdirectory of a
// directory so marked in a block group of its own, as it does for the
// subdirectories of the filesystem root.
const fsTopDirFlag = 0x00020000

// MarkTopDir asks the filesystem to treat dir's subdirectories as unrelated
// trees (decision 1512). Every layer is unpacked into a new subdirectory of
// ingest/, so each one lands in a block group chosen afresh instead of the
// groups the store used last, which, after a removal, are full of inodes
// that ext4 without a journal refuses to reuse for a while and scans past
// one by one. It is only a placement hint: filesystems that have no such
// flag (xfs, btrfs, tmpfs, overlayfs) refuse it, and that is not an error
// (false, nil). The benchmark's unpack floor uses it too, so that it
// measures file creation as a pull now gets it.
func MarkTopDir(dir string) (bool, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err == nil && flags&fsTopDirFlag == 0 {
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopDirFlag))
	}
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL):
		return false, nil
	}
	return false, fmt.Errorf("set the top-directory flag on %s: %w", dir, err)
}
