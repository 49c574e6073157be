package monitor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// attach serves one attach connection: it answers the request, then relays
// output frames to the client and its stdin/resize frames to the container.
func (p *Pod) attach(conn *os.File, req *proto.Request) {
	c, err := p.get(req.ID)
	if err != nil {
		_ = proto.WriteResponse(conn, proto.ErrorResponse(err))
		return
	}
	if c.hasExited() {
		_ = proto.WriteResponse(conn, proto.ErrorResponse(fmt.Errorf("container %s is not running: %w", c.id, errdefs.ErrFailedPrecondition)))
		return
	}
	a := &attachment{conn: conn, stdout: req.Stdout, stderr: req.Stderr}
	a.wmu.Lock()
	err = proto.WriteResponse(conn, &proto.Response{State: c.state()})
	a.wmu.Unlock()
	if err != nil {
		return
	}
	c.attaches.add(a)
	defer func() {
		c.attaches.remove(a)
		if req.Stdin && c.stdinOnce && c.stdio.closeStdin() {
			p.mon.keeper.note(proto.KeeperCloseStdin, c.id)
		}
	}()
	buf := make([]byte, 0, 4096)
	for {
		kind, payload, err := proto.ReadFrame(conn, buf)
		if err != nil {
			return
		}
		switch kind {
		case proto.FrameStdin:
			if req.Stdin {
				c.stdio.write(payload)
			}
		case proto.FrameCloseStdin:
			// The client's input ended: that ends the container's stdin
			// only for stdin_once containers (as in containerd).
			if req.Stdin && c.stdinOnce && c.stdio.closeStdin() {
				p.mon.keeper.note(proto.KeeperCloseStdin, c.id)
			}
		case proto.FrameResize:
			if len(payload) == 4 {
				c.stdio.resize(binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:]))
			}
		}
	}
}

// attachment is one attached client.
type attachment struct {
	conn           *os.File
	stdout, stderr bool
	wmu            sync.Mutex // one frame at a time
}

// attachSet is a container's attached clients. Its lock is held while a
// chunk is fanned out, so it is apart from the container's: a slow client
// (up to its write deadline) must not hold up state reads.
type attachSet struct {
	mu sync.Mutex
	m  map[*attachment]struct{}
}

func (s *attachSet) add(a *attachment) {
	s.mu.Lock()
	s.m[a] = struct{}{}
	s.mu.Unlock()
}

func (s *attachSet) remove(a *attachment) {
	s.mu.Lock()
	delete(s.m, a)
	s.mu.Unlock()
}

// closeAll ends every attach stream (the container exited).
func (s *attachSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a := range s.m {
		a.conn.Close()
	}
}

// fanout sends a chunk of output to the clients attached to its stream.
func (s *attachSet) fanout(kind byte, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a := range s.m {
		if (kind == proto.FrameStdout && !a.stdout) || (kind == proto.FrameStderr && !a.stderr) {
			continue
		}
		a.wmu.Lock()
		// A stuck client must not stall the log.
		_ = a.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		err := proto.WriteFrame(a.conn, kind, data)
		a.wmu.Unlock()
		if err != nil {
			a.conn.Close()
			delete(s.m, a)
		}
	}
}

// stdio is what the monitor holds of a container's input: the write end of
// its stdin pipe, or the pty master of a terminal container. Its own lock:
// a write to a container that does not read its stdin parks until it does,
// and must not hold up anything but other writes.
type stdio struct {
	mu      sync.Mutex
	stdin   *os.File // nil when none or closed
	console *os.File // pty master, nil unless a terminal
}

// set hands the container its stdin and pty (either may be nil).
func (s *stdio) set(stdin, console *os.File) {
	s.mu.Lock()
	s.stdin, s.console = stdin, console
	s.mu.Unlock()
}

func (s *stdio) write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.console != nil:
		_, _ = s.console.Write(p)
	case s.stdin != nil:
		_, _ = s.stdin.Write(p)
	}
}

// closeStdin closes the container's stdin; closed is false when it was
// closed already (or there is none).
func (s *stdio) closeStdin() (closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdin != nil {
		s.stdin.Close()
		s.stdin = nil
		return true
	}
	return false
}

func (s *stdio) resize(width, height uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.console == nil {
		return
	}
	rc, err := s.console.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: width, Row: height})
	})
}

func (s *stdio) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stdin != nil {
		s.stdin.Close()
		s.stdin = nil
	}
	if s.console != nil {
		s.console.Close()
		s.console = nil
	}
}

type consoleResult struct {
	f   *os.File
	err error
}

var errBadConsole = errors.New("bad console message")

// receiveConsole accepts the runtime's connection on the console socket and
// takes the pty master it sends with SCM_RIGHTS. The master is made
// non-blocking so its reads park in the poller rather than hold a thread.
func receiveConsole(ln *os.File) consoleResult {
	conn, err := accept(ln)
	if err != nil {
		return consoleResult{err: err}
	}
	defer conn.Close()
	fd, err := recvFd(conn)
	if err != nil {
		return consoleResult{err: err}
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return consoleResult{err: err}
	}
	return consoleResult{f: os.NewFile(uintptr(fd), "pty-master")}
}
