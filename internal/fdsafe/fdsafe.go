// Package fdsafe keeps descriptors a berth process did not open itself
// from reaching the processes it starts (berth's side of the runc
// "Leaky Vessels" class, CVE-2024-21626): whatever berthd or berth-shim
// inherited beyond stdin, stdout and stderr — from a careless service
// manager, a shell, a test harness, or on purpose from its parent — is
// made close-on-exec at start. The process itself still uses the
// descriptors it was handed on purpose; a child gets only what it is
// given explicitly (os/exec ExtraFiles, syscall.ProcAttr.Files).
package fdsafe

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseOnExecFrom3 marks every open descriptor from 3 up close-on-exec.
// It is meant for the first line of main: nothing races it for the
// descriptors there, and marking one twice is harmless.
func CloseOnExecFrom3() {
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return
	}
	// Kernels before 5.11.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}
