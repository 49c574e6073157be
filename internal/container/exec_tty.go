package container

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// consoleSocket receives the pty master the runtime sends for a TTY exec
// (runc --console-socket) and pumps it to the caller's streams.
type consoleSocket struct {
	ln     *net.UnixListener
	dir    *os.File
	path   string // what the runtime dials: short, through /proc/self/fd
	master chan *os.File
	wg     sync.WaitGroup
	pty    *os.File
	mu     sync.Mutex
}

func newConsoleSocket(dir string) (*consoleSocket, error) {
	// dir/console.sock can exceed the 108-byte limit of a socket address:
	// bind and dial it through an fd link to dir instead.
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("exec console socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/console.sock", d.Fd()), Net: "unix"})
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("exec console socket in %s: %w", dir, err)
	}
	c := &consoleSocket{ln: ln, dir: d, master: make(chan *os.File, 1)}
	c.path = fmt.Sprintf("/proc/%d/fd/%d/console.sock", os.Getpid(), d.Fd())
	go func() {
		f, err := receivePTY(ln)
		if err != nil {
			close(c.master)
			return
		}
		c.master <- f
	}()
	return c, nil
}

func receivePTY(ln *net.UnixListener) (*os.File, error) {
	_ = ln.SetDeadline(time.Now().Add(30 * time.Second))
	conn, err := ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	buf := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("bad console message: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("bad console rights: %v", err)
	}
	return os.NewFile(uintptr(fds[0]), "exec-pty"), nil
}

// serve waits for the pty, then copies it both ways and applies resizes.
func (c *consoleSocket) serve(o ExecOptions, done <-chan error) {
	var pty *os.File
	select {
	case pty = <-c.master:
	case <-time.After(30 * time.Second):
	}
	if pty == nil {
		return
	}
	c.mu.Lock()
	c.pty = pty
	c.mu.Unlock()
	if o.Stdin != nil {
		go func() { _, _ = io.Copy(pty, o.Stdin) }()
	}
	if o.Resize != nil {
		go func() {
			for sz := range o.Resize {
				_ = unix.IoctlSetWinsize(int(pty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Col: sz.Width, Row: sz.Height})
			}
		}()
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		out := o.Stdout
		if out == nil {
			out = io.Discard
		}
		// Ends with EIO once the last process holding the slave exits.
		_, _ = io.Copy(out, pty)
	}()
}

// wait drains the pty output, bounded by drainTimeout.
func (c *consoleSocket) wait() {
	drained := make(chan struct{})
	go func() { c.wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		c.mu.Lock()
		if c.pty != nil {
			c.pty.Close()
		}
		c.mu.Unlock()
		<-drained
	}
}

func (c *consoleSocket) Close() {
	c.ln.Close()
	c.dir.Close()
	c.mu.Lock()
	if c.pty != nil {
		c.pty.Close()
	}
	c.mu.Unlock()
}
