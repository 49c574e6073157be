package image

import (
	"errors"
	"io"
	"sync"
)

var errReadAheadClosed = errors.New("read-ahead closed")

// readAhead reads src on a goroutine of its own, up to depth chunks ahead
// of its reader. A layer stream uses it between decompression and unpack,
// so that the download, both hashes and the decompressor run on one core
// while the files are written on another.
type readAhead struct {
	chunks   chan []byte   // filled chunks, closed after the last
	free     chan []byte   // empty buffers
	done     chan struct{} // closed by Close: the filler stops
	finished chan struct{} // closed when the filler has returned
	err      error         // the filler's last error (io.EOF at the end); read after chunks closed
	buf, cur []byte        // the chunk being read and what is left of it
	once     sync.Once
}

func newReadAhead(src io.Reader, size, depth int) *readAhead {
	ra := &readAhead{
		chunks: make(chan []byte, depth), free: make(chan []byte, depth),
		done: make(chan struct{}), finished: make(chan struct{}),
	}
	for i := 0; i < depth; i++ {
		ra.free <- make([]byte, size)
	}
	go ra.fill(src)
	return ra
}

func (ra *readAhead) fill(src io.Reader) {
	defer close(ra.finished)
	defer close(ra.chunks)
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			ra.err = errReadAheadClosed
			return
		}
		n := 0
		var err error
		for n < len(buf) && err == nil {
			var m int
			m, err = src.Read(buf[n:])
			n += m
		}
		if n > 0 {
			select {
			case ra.chunks <- buf[:n]:
			case <-ra.done:
				ra.err = errReadAheadClosed
				return
			}
		}
		if err != nil {
			ra.err = err
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.buf != nil {
			ra.free <- ra.buf[:cap(ra.buf)] // never blocks: depth buffers in all
			ra.buf = nil
		}
		b, ok := <-ra.chunks
		if !ok {
			return 0, ra.err
		}
		ra.buf, ra.cur = b, b
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// Close stops the filler and waits for it: after Close nothing reads src.
func (ra *readAhead) Close() {
	ra.once.Do(func() { close(ra.done) })
	<-ra.finished
}
