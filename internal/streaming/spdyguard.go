package streaming

import (
	"bufio"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
)

// The kubelet library reads SPDY frames with moby/spdystream, which
// inflates a frame's whole compressed header block before anything looks
// at it: up to 1000 headers of up to 1 MiB each. One SYN_STREAM of about
// a MiB on the wire is then half a GiB or more in berthd, and a client
// only needs one exec, attach or port-forward URL (a user with pods/exec,
// through the kubelet's proxy) to send it. The guard below reads the
// client's frames before the library does and closes the connection on a
// control frame or an inflated header block beyond these bounds. The
// kubelet's clients send a handful of short headers per stream.
const (
	// maxSPDYControlFrame bounds a control frame's payload (the protocol
	// allows 16 MiB).
	maxSPDYControlFrame = 64 << 10
	// maxSPDYHeaderBlock bounds one frame's header block once inflated.
	maxSPDYHeaderBlock = 64 << 10
)

// errSPDYRefused ends a connection whose client broke a bound.
var errSPDYRefused = errors.New("spdy frame refused")

// withSPDYGuard puts the guard on every SPDY upgrade next makes (exec,
// attach and port-forward, tunnelled ones included).
func withSPDYGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, ok := w.(http.Hijacker); ok && strings.Contains(strings.ToLower(r.Header.Get("Upgrade")), "spdy/") {
			w = &spdyGuardWriter{ResponseWriter: w, hijacker: h}
		}
		next.ServeHTTP(w, r)
	})
}

// spdyGuardWriter hands the upgrade a guarded connection.
type spdyGuardWriter struct {
	http.ResponseWriter
	hijacker http.Hijacker
}

func (w *spdyGuardWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := w.hijacker.Hijack()
	if err != nil {
		return nil, nil, err
	}
	g := &spdyGuardConn{Conn: conn, r: rw.Reader, done: make(chan struct{})}
	return g, bufio.NewReadWriter(bufio.NewReader(g), rw.Writer), nil
}

// spdyGuardConn passes the client's frames on once checked: data frames
// as they come, control frames whole after their bounds are checked.
type spdyGuardConn struct {
	net.Conn
	r       io.Reader // the client's bytes: the hijacked buffer, then the connection
	pending []byte    // checked bytes not yet read by the library
	data    int       // bytes of a data frame's payload still to pass on
	err     error     // sticky: the connection is finished
	headers *spdyHeaderCounter

	closeOnce sync.Once
	done      chan struct{} // closed by Close
}

// Read is called by the library's one frame-reading goroutine.
func (c *spdyGuardConn) Read(p []byte) (int, error) {
	for len(c.pending) == 0 && c.data == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if err := c.nextFrame(); err != nil {
			c.err = err
			if errors.Is(err, errSPDYRefused) {
				c.Close()
			}
			return 0, err
		}
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if len(p) > c.data {
		p = p[:c.data]
	}
	n, err := c.r.Read(p)
	c.data -= n
	if err != nil {
		c.err = err
	}
	return n, err
}

func (c *spdyGuardConn) Close() error {
	c.closeOnce.Do(func() { close(c.done) })
	return c.Conn.Close()
}

// nextFrame reads the next frame's header and, for a control frame, the
// whole frame, and checks it.
func (c *spdyGuardConn) nextFrame() error {
	var h [8]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return err
	}
	length := int(binary.BigEndian.Uint32(h[4:]) & 0xffffff)
	if h[0]&0x80 == 0 { // data frame: its payload is the stream's bytes
		c.pending = append(c.pending[:0], h[:]...)
		c.data = length
		return nil
	}
	if length > maxSPDYControlFrame {
		return fmt.Errorf("%w: control frame of %d bytes, more than %d", errSPDYRefused, length, maxSPDYControlFrame)
	}
	frame := make([]byte, 8+length)
	copy(frame, h[:])
	typ := binary.BigEndian.Uint16(h[2:4])
	read := 8
	if typ == 4 && length >= 4 {
		// SETTINGS: the entry count comes first, and is judged at once
		// (the library would have read it, and refused, by now).
		if _, err := io.ReadFull(c.r, frame[8:12]); err != nil {
			return err
		}
		if n := binary.BigEndian.Uint32(frame[8:12]); n > uint32(length-4)/8 {
			return fmt.Errorf("%w: SETTINGS declares %d entries in %d bytes", errSPDYRefused, n, length)
		}
		read = 12
	}
	if _, err := io.ReadFull(c.r, frame[read:]); err != nil {
		return err
	}
	// SPDY/3: SYN_STREAM's header block starts after the stream IDs,
	// priority and slot; SYN_REPLY's and HEADERS' after the stream ID.
	off := -1
	switch typ {
	case 1:
		off = 10
	case 2, 8:
		off = 4
	}
	if off >= 0 && length >= off {
		if c.headers == nil {
			c.headers = newSPDYHeaderCounter(c.done)
		}
		if err := c.headers.check(frame[8+off:]); err != nil {
			return err
		}
	}
	c.pending = frame
	return nil
}

// spdyHeaderCounter inflates the connection's header blocks (one zlib
// stream across all frames, as SPDY compresses them) only to count their
// bytes, stopping as soon as a block's output passes the bound. It runs in
// its own goroutine because inflation of the shared stream must wait for
// the next block in the middle of a read; the goroutine ends with the
// connection.
type spdyHeaderCounter struct {
	in     chan []byte   // the next block
	result chan error    // nil: the block inflated within the bound
	done   chan struct{} // the connection is closed
}

func newSPDYHeaderCounter(done chan struct{}) *spdyHeaderCounter {
	h := &spdyHeaderCounter{in: make(chan []byte), result: make(chan error), done: done}
	go h.run()
	return h
}

func (h *spdyHeaderCounter) check(block []byte) error {
	select {
	case h.in <- block:
	case <-h.done:
		return net.ErrClosed
	}
	select {
	case err := <-h.result:
		if err != nil {
			h.in = nil // the counter is gone: a later check would block
		}
		return err
	case <-h.done:
		return net.ErrClosed
	}
}

func (h *spdyHeaderCounter) run() {
	src := &spdyBlockSource{h: h}
	fail := func(err error) {
		select {
		case h.result <- err:
		case <-h.done:
		}
	}
	// The zlib header: SPDY's streams name a preset dictionary. Only the
	// output's length matters here, so a zeroed window of the largest
	// size stands in for the dictionary's contents.
	cmf, err1 := src.ReadByte()
	flg, err2 := src.ReadByte()
	if err := errors.Join(err1, err2); err != nil {
		fail(err)
		return
	}
	if cmf&0x0f != 8 || (uint16(cmf)<<8|uint16(flg))%31 != 0 {
		fail(fmt.Errorf("%w: header block is not zlib", errSPDYRefused))
		return
	}
	if flg&0x20 != 0 {
		for i := 0; i < 4; i++ {
			if _, err := src.ReadByte(); err != nil {
				fail(err)
				return
			}
		}
	}
	fr := flate.NewReaderDict(src, make([]byte, 32<<10))
	buf := make([]byte, 32<<10)
	for {
		n, err := fr.Read(buf)
		src.count += n
		if src.count > maxSPDYHeaderBlock {
			fail(fmt.Errorf("%w: header block inflates beyond %d bytes", errSPDYRefused, maxSPDYHeaderBlock))
			return
		}
		if err != nil {
			select {
			case <-h.done:
			default:
				fail(fmt.Errorf("%w: header block: %v", errSPDYRefused, err))
			}
			return
		}
	}
}

// spdyBlockSource feeds the inflater one block at a time: when a block is
// used up it reports the block as good and waits for the next one. It is
// a flate.Reader, so the inflater reads no further ahead than it needs.
type spdyBlockSource struct {
	h      *spdyHeaderCounter
	cur    []byte
	active bool // a block is being inflated and its caller waits
	count  int  // bytes inflated since the block began
}

func (s *spdyBlockSource) ReadByte() (byte, error) {
	for len(s.cur) == 0 {
		if s.active {
			s.active = false
			select {
			case s.h.result <- nil:
			case <-s.h.done:
				return 0, io.EOF
			}
		}
		select {
		case b := <-s.h.in:
			s.cur, s.active, s.count = b, true, 0
		case <-s.h.done:
			return 0, io.EOF
		}
	}
	b := s.cur[0]
	s.cur = s.cur[1:]
	return b, nil
}

func (s *spdyBlockSource) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b, err := s.ReadByte()
	if err != nil {
		return 0, err
	}
	p[0] = b
	return 1, nil
}
