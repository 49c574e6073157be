package monitor

import (
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// waiter is a connection waiting for a container's exit. No goroutine
// holds it (each would keep a stack for as long as the container runs):
// waitExit answers it, and the housekeeping drops it once its client went
// away (a killed berthd's), so waits do not pile up in the monitor.
type waiter struct {
	conn  *os.File
	rc    syscall.RawConn
	probe [1]byte
	gone  bool
	peek  func(fd uintptr) bool
}

func newWaiter(conn *os.File) (*waiter, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	w := &waiter{conn: conn, rc: rc}
	w.peek = func(fd uintptr) bool {
		// Nothing may arrive while waiting: data (n > 0), EOF (n == 0)
		// and errors other than "nothing yet" all mean the client gave
		// up. Peeking allocates nothing, so an idle monitor makes no garbage.
		_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&w.probe[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		w.gone = errno != unix.EAGAIN && errno != unix.EINTR
		return true
	}
	return w, nil
}

func (w *waiter) clientGone() bool { return w.rc.Read(w.peek) != nil || w.gone }

// wait answers at once when the container has exited, or parks conn on
// it (parked: the container now owns conn).
func (p *Pod) wait(conn *os.File, req *proto.Request) (parked bool, err error) {
	c, err := p.get(req.ID)
	if err != nil {
		return false, proto.WriteResponse(conn, proto.ErrorResponse(err))
	}
	w, err := newWaiter(conn)
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	if c.phase != phaseExited {
		c.waiters = append(c.waiters, w)
		c.mu.Unlock()
		return true, nil
	}
	c.mu.Unlock()
	return false, proto.WriteResponse(conn, &proto.Response{State: c.state()})
}

// answerWaiters tells the parked waits of c that it exited and serves
// their connections on.
func (p *Pod) answerWaiters(c *container, ws []*waiter) {
	if len(ws) == 0 {
		return
	}
	resp := &proto.Response{State: c.state()}
	for _, w := range ws {
		// A stuck client must not hold up the others.
		_ = w.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if proto.WriteResponse(w.conn, resp) != nil {
			w.conn.Close()
			continue
		}
		_ = w.conn.SetWriteDeadline(time.Time{})
		go p.serveConn(w.conn)
	}
}

// dropGoneWaiters closes the parked waits whose clients went away.
func (p *Pod) dropGoneWaiters() { p.each((*container).dropGoneWaiters) }

func (c *container) dropGoneWaiters() {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.clientGone() {
			w.conn.Close()
			continue
		}
		kept = append(kept, w)
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
}
