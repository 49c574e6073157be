package monitor

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// maxLogLine is the longest log record; longer lines become P records.
const maxLogLine = 16 << 10

// logSink is a container's CRI log file. It has its own lock: the output
// copiers write through it once per record, reopen-log swaps the file,
// and neither should wait behind anything else (nor anything else behind a
// slow disk).
type logSink struct {
	path string // fixed at create; "" means no CRI log
	// dir is the pod's log directory, path's ancestor: nothing between
	// them may be a symlink (openLogFile).
	dir string

	mu sync.Mutex
	f  *os.File
	// Records not written in full since the container was created, and the
	// last failure (a full or failing disk must not go unnoticed: berthd
	// reads them in the container's state).
	failures uint64
	lastErr  unix.Errno // 0: the last failure was a short write
	failing  bool       // the last record failed
	// torn: the last record was cut short, so the next one starts with a
	// newline to end that line rather than run on in it.
	torn bool
}

// open opens (or reopens, after the kubelet rotated it) the log file.
func (l *logSink) open() error {
	if l.path == "" {
		return nil
	}
	f, err := openLogFile(l.dir, l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f, l.torn = f, false
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// openLogFile opens the CRI log file path for appending, creating it
// (and the directories between dir and it) as needed. The monitor runs as
// root and the pod's log directory may be reachable from a container
// (a log collector's hostPath volume, or a pod that mounts
// /var/log/pods): a symlink or hard link planted there must not make a
// container's output append to a host file (issue 34, finding 6). So
// dir, the kubelet's own log_directory, is the only path resolved the
// ordinary way; every component below it is opened with O_NOFOLLOW from
// its parent's descriptor — which works on every kernel, unlike openat2's
// RESOLVE_NO_SYMLINKS, and also lets the missing directories be made
// beneath the same descriptors — and the file must be a regular file with
// no other link. O_NONBLOCK keeps a planted FIFO from blocking the open.
// An empty dir (an older berthd) is path's own directory.
func openLogFile(dir, path string) (*os.File, error) {
	if dir == "" {
		dir = filepath.Dir(path)
	}
	rel, err := filepath.Rel(dir, path)
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || !filepath.IsAbs(path) || err != nil ||
		rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("log %s is not beneath the pod's log directory %s: %w", path, dir, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create log dir: %w", err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open log dir %s: %w", dir, err)
	}
	defer func() { unix.Close(dfd) }()
	parts := strings.Split(rel, "/")
	for _, name := range parts[:len(parts)-1] {
		if err := unix.Mkdirat(dfd, name, 0o755); err != nil && err != unix.EEXIST {
			return nil, fmt.Errorf("create log dir %s: %w", filepath.Join(dir, name), err)
		}
		nfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open log %s: %s is a symlink or not a directory (%w): %w",
				path, name, err, errdefs.ErrFailedPrecondition)
		}
		unix.Close(dfd)
		dfd = nfd
	}
	name := parts[len(parts)-1]
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o640)
	if err != nil {
		if err == unix.ELOOP || err == unix.ENXIO {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("open log %s (symlinks refused): %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat log %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("log %s is not a regular file of one link (mode %#o, %d links): %w",
			path, st.Mode, st.Nlink, errdefs.ErrFailedPrecondition)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("log %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

func (l *logSink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// logWrite is how one record's write went, for the caller to report
// outside the lock.
type logWrite uint8

const (
	logWriteOK       logWrite = iota
	logWriteFailed            // failed, and the one before did not
	logWriteFailing           // failed again
	logWriteResumed           // succeeded after failures
	logWriteDisabled          // no log file
)

// write appends one record `<RFC3339Nano> <stream> <F|P> <msg>\n` with a
// single writev, so records from stdout and stderr never interleave. It
// allocates nothing: the header and the iovecs live on the stack.
func (l *logSink) write(stream, tag string, msg []byte) logWrite {
	var hdr [64]byte
	h := time.Now().UTC().AppendFormat(hdr[:0], time.RFC3339Nano)
	h = append(h, ' ')
	h = append(h, stream...)
	h = append(h, ' ')
	h = append(h, tag...)
	h = append(h, ' ')
	nl := [1]byte{'\n'}
	var iov [4]unix.Iovec
	n, total := 0, 0
	add := func(b *byte, size int) {
		iov[n].Base = b
		iov[n].SetLen(size)
		n++
		total += size
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return logWriteDisabled
	}
	if l.torn {
		add(&nl[0], 1)
	}
	add(&h[0], len(h))
	if len(msg) > 0 {
		add(&msg[0], len(msg))
	}
	add(&nl[0], 1)
	written, _, errno := unix.Syscall(unix.SYS_WRITEV, l.f.Fd(), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	if errno == 0 && int(written) == total {
		l.torn = false
		if l.failing {
			l.failing = false
			return logWriteResumed
		}
		return logWriteOK
	}
	l.failures++
	l.lastErr = errno
	if errno == 0 && written > 0 {
		l.torn = true
	}
	if l.failing {
		return logWriteFailing
	}
	l.failing = true
	return logWriteFailed
}

// writeErrors reports how many records were lost or cut short, and the
// last failure.
func (l *logSink) writeErrors() (uint64, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.failures == 0:
		return 0, ""
	case l.lastErr == 0:
		return l.failures, io.ErrShortWrite.Error()
	default:
		return l.failures, l.lastErr.Error()
	}
}

// writeLog writes one record and reports the start and the end of a run
// of failures in the monitor's log (allocating only then).
func (c *container) writeLog(stream, tag string, msg []byte) {
	switch c.log.write(stream, tag, msg) {
	case logWriteFailed:
		n, why := c.log.writeErrors()
		c.logf("container %s: CRI log %s: write failed (%s); %d records lost so far", c.id, c.log.path, why, n)
	case logWriteResumed:
		n, _ := c.log.writeErrors()
		c.logf("container %s: CRI log %s: writes resumed; %d records lost in all", c.id, c.log.path, n)
	}
}

func (c *container) reopenLog() error {
	if c.hasExited() {
		return fmt.Errorf("container %s is not running: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	return c.log.open()
}

// copyOutput reads one stream of the container, writes CRI log records and
// feeds attached clients. One goroutine and one 16 KiB buffer per stream.
func (c *container) copyOutput(r *os.File, name string, closeAtEnd bool) {
	defer c.streams.Done()
	if closeAtEnd {
		defer r.Close()
	}
	frame := proto.FrameStdout
	if name == "stderr" {
		frame = proto.FrameStderr
	}
	lines := newLineSplitter(func(tag string, msg []byte) { c.writeLog(name, tag, msg) })
	// Logged first (inside readOnce), then attached clients: whoever saw a
	// line can rely on it being in the log.
	fan := func(chunk []byte) { c.attaches.fanout(frame, chunk) }
	for {
		if err := lines.readOnce(r, fan); err != nil {
			lines.Flush()
			return
		}
	}
}

// lineSplitter turns a byte stream into CRI log records: every complete
// line is an F record; a line longer than maxLogLine is cut into P records
// ending with an F record; what is left at the end of the stream is P.
type lineSplitter struct {
	buf     []byte
	n       int
	partial bool // the last record was P: the line is still open
	emit    func(tag string, msg []byte)
}

func newLineSplitter(emit func(tag string, msg []byte)) *lineSplitter {
	return &lineSplitter{buf: make([]byte, maxLogLine), emit: emit}
}

// readOnce does one read from r into the buffer, emits the records it
// completes, then passes the bytes read to fan. Nothing is allocated: the
// chunk is handed over before the buffer is compacted.
func (l *lineSplitter) readOnce(r io.Reader, fan func([]byte)) error {
	m, err := r.Read(l.buf[l.n:])
	if m > 0 {
		from := l.n
		done := l.consume(m)
		fan(l.buf[from : from+m])
		l.compact(done)
	}
	return err
}

// Write feeds p through the splitter (used by tests and the fuzz target).
func (l *lineSplitter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		m := copy(l.buf[l.n:], p)
		p = p[m:]
		l.compact(l.consume(m))
	}
	return total, nil
}

// consume accounts for m new bytes at buf[n:], emits the records they
// complete and returns how many bytes at the buffer's start are done with.
func (l *lineSplitter) consume(m int) int {
	l.n += m
	start := 0
	for {
		i := indexNewline(l.buf[start:l.n])
		if i < 0 {
			break
		}
		l.emit("F", l.buf[start:start+i])
		l.partial = false
		start += i + 1
	}
	if start == 0 && l.n == len(l.buf) {
		l.emit("P", l.buf[:l.n])
		l.partial = true
		start = l.n
	}
	return start
}

// compact drops the first done bytes of the buffer.
func (l *lineSplitter) compact(done int) {
	copy(l.buf, l.buf[done:l.n])
	l.n -= done
}

// Flush ends the stream: an unterminated last line becomes P, as in
// containerd, because the kubelet gives an F record's content a newline
// ("echo -n DONE" would read back as "DONE\n", in FallbackToLogsOnError
// termination messages too); nothing is added after a line already cut
// into P records.
func (l *lineSplitter) Flush() {
	if l.n > 0 {
		l.emit("P", l.buf[:l.n])
	}
	l.n, l.partial = 0, false
}

func indexNewline(b []byte) int {
	for i, x := range b {
		if x == '\n' {
			return i
		}
	}
	return -1
}
