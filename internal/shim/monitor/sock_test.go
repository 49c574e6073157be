package monitor

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// openFds counts the test process's open descriptors.
func openFds(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestRecvFdClosesWhatItDoesNotWant sends the console socket one
// descriptor, then two SCM_RIGHTS control messages in one message, then
// several descriptors in one: recvFd returns the one, refuses the others
// and leaves none of theirs open (issue 34, finding 11).
func TestRecvFdClosesWhatItDoesNotWant(t *testing.T) {
	devnull := func() int {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	a, b, c := devnull(), devnull(), devnull()
	for _, tc := range []struct {
		name string
		oob  []byte
		ok   bool
	}{
		{"one fd", unix.UnixRights(a), true},
		{"two control messages", append(unix.UnixRights(a), unix.UnixRights(b)...), false},
		{"three fds in one message", unix.UnixRights(a, b, c), false},
		{"no fd", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(pair[0])
			recv := os.NewFile(uintptr(pair[1]), "recv")
			defer recv.Close()
			before := openFds(t)
			if err := unix.Sendmsg(pair[0], []byte("x"), tc.oob, nil, 0); err != nil {
				t.Fatal(err)
			}
			fd, err := recvFd(recv)
			if tc.ok {
				if err != nil {
					t.Fatalf("recvFd: %v", err)
				}
				unix.Close(fd)
			} else if !errors.Is(err, errBadConsole) {
				if err == nil {
					unix.Close(fd)
				}
				t.Fatalf("recvFd: fd %d, %v; want errBadConsole", fd, err)
			}
			if after := openFds(t); after != before {
				t.Fatalf("%d descriptors open before recvFd, %d after", before, after)
			}
		})
	}
}
