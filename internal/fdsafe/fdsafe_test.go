package fdsafe

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestCloseOnExecFrom3(t *testing.T) {
	// A descriptor opened without O_CLOEXEC, as an inherited one is.
	fd, err := unix.Open("/dev/null", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC != 0 {
		t.Fatalf("setup: flags %#x, %v", flags, err)
	}
	CloseOnExecFrom3()
	flags, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("descriptor %d: flags %#x, %v; want FD_CLOEXEC", fd, flags, err)
	}
	// Still open and usable by this process.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil {
		t.Fatalf("descriptor %d closed: %v", fd, err)
	}
}
