package monitor

import (
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// The monitor serves its unix sockets without package net: a non-blocking
// socket wrapped in an *os.File is served by the runtime's poller (reads,
// writes and deadlines park the goroutine, not a thread), and net's init,
// resolver and connection types are not worth their memory here.

// listenUnix listens on path, however long.
func listenUnix(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	err = proto.WithShortPath(path, func(p string) error {
		return os.NewSyscallError("bind", unix.Bind(fd, &unix.SockaddrUnix{Name: p}))
	})
	if err == nil {
		err = os.NewSyscallError("listen", unix.Listen(fd, 64))
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// serveAccepted serves each connection on ln on a goroutine of its own
// until ln is closed for good (closing says so); any other accept error
// (out of fds or memory) backs off rather than spins.
func serveAccepted(ln *os.File, closing func() bool, logf func(string, ...any), serve func(*os.File)) {
	for {
		conn, err := accept(ln)
		if err != nil {
			if closing() {
				return
			}
			logf("accept on %s: %v", ln.Name(), err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go serve(conn)
	}
}

// accept waits for the next connection on ln.
func accept(ln *os.File) (*os.File, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var aerr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			switch aerr {
			case unix.EINTR, unix.ECONNABORTED:
				continue
			case unix.EAGAIN:
				return false
			}
			return true
		}
	})
	if err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, os.NewSyscallError("accept", aerr)
	}
	return os.NewFile(uintptr(nfd), "conn"), nil
}

// recvFd reads one message from conn and returns the file descriptor it
// carries (SCM_RIGHTS): the runtime's console. Whatever else arrives with
// it — more descriptors, in one control message or several — is closed:
// the monitor lives as long as its pods, and a peer that sends more than
// it should must not leave descriptors open in it (issue 34, finding 11).
func recvFd(conn *os.File) (int, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return -1, err
	}
	buf := make([]byte, 256)
	// Room for a few descriptors: the kernel closes those that do not fit
	// (MSG_CTRUNC), but ones that fit must be seen to be closed.
	oob := make([]byte, unix.CmsgSpace(maxRecvFds*4))
	var oobn, flags int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		_, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return -1, err
	}
	if rerr != nil {
		return -1, os.NewSyscallError("recvmsg", rerr)
	}
	msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	if perr != nil || len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, errBadConsole
	}
	return fds[0], nil
}

// maxRecvFds is how many descriptors recvFd makes room for (it wants one).
const maxRecvFds = 8
