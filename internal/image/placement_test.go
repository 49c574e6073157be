package image

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestMarkTopDir(t *testing.T) {
	dir := t.TempDir()
	ok, err := MarkTopDir(dir)
	if err != nil {
		t.Fatalf("MarkTopDir: %v", err)
	}
	if !ok {
		t.Skipf("the filesystem of %s has no top-directory flag", dir)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	if flags&fsTopDirFlag == 0 {
		t.Fatalf("flags %#x lack FS_TOPDIR_FL", flags)
	}
	// Marking again is a no-op.
	if ok, err := MarkTopDir(dir); err != nil || !ok {
		t.Fatalf("second MarkTopDir: %v, %v", ok, err)
	}
}
