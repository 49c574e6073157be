package container

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// execTTY is the terminal of a TTY exec. runc cannot hand a console socket
// to an exec it waits for, so it allocates the container-side pty itself
// and relays it to its own stdio; berth gives runc the slave of a second
// pty as stdio and holds its master. Resizes are set on that master and
// runc is told with SIGWINCH, as a terminal would tell it.
type execTTY struct {
	master, slave *os.File
	wg            sync.WaitGroup
	pidFile       string
}

func newExecTTY(pidFile string) (*execTTY, error) {
	m, s, err := openPTY()
	if err != nil {
		return nil, fmt.Errorf("exec terminal: %w", err)
	}
	return &execTTY{master: m, slave: s, pidFile: pidFile}, nil
}

// ptyControl runs fn on f's descriptor without File.Fd: Fd would put the
// master in blocking mode, where Close no longer interrupts a read of it
// (finish's drain bound then cannot end the output relay), and a resize
// racing Close could hit a reused descriptor number. Control holds the
// descriptor for fn's duration and fails once f is closed.
func ptyControl(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// openPTY opens a new pseudo-terminal pair.
func openPTY() (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := ptyControl(m, func(fd int) error { return unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0) }); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	var n int
	if err := ptyControl(m, func(fd int) (err error) { n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN); return err }); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, s, nil
}

// start relays the caller's streams to the terminal and applies resizes.
func (t *execTTY) start(o ExecOptions) {
	if o.Stdin != nil {
		go func() { _, _ = io.Copy(t.master, o.Stdin) }()
	}
	if o.Resize != nil {
		go func() {
			for sz := range o.Resize {
				t.resize(sz)
			}
		}()
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		out := o.Stdout
		if out == nil {
			out = io.Discard
		}
		// Ends with EIO once nothing holds the slave any more.
		_, _ = io.Copy(out, t.master)
	}()
}

func (t *execTTY) resize(sz TerminalSize) {
	if ptyControl(t.master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: sz.Width, Row: sz.Height})
	}) != nil {
		return // the session is over
	}
	// runc relays the size when it gets SIGWINCH; it is the parent of the
	// exec'd process (it makes itself a subreaper while it waits).
	if data, err := os.ReadFile(t.pidFile); err == nil {
		if ppid := parentPID(strings.TrimSpace(string(data))); ppid > 1 {
			_ = unix.Kill(ppid, unix.SIGWINCH)
		}
	}
}

// parentPID reads the parent of pid from /proc.
func parentPID(pid string) int {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndex(s, ") ")
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// finish drops our slave and drains the output, bounded by drainTimeout.
func (t *execTTY) finish() {
	t.slave.Close()
	drained := make(chan struct{})
	go func() { t.wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		t.master.Close()
		<-drained
	}
}

func (t *execTTY) Close() {
	t.slave.Close()
	t.master.Close()
}
