package lazysrv

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/net/netutil"

	"github.com/berthcri/berth/internal/lazy"
)

// The range protocol between a server and berthd, on berthd's unix
// socket (Meta.Socket): one request per connection, a JSON line
// (RangeRequest), answered by a JSON line (rangeAnswer) and, if it is not
// an error, exactly the bytes asked for. berthd reads them from the
// registry with the pull's credentials; the server checks each chunk
// against its TOC digest as it would the registry's (lazy.Layer).

// MaxRange bounds one range request: a chunk is at most a few MiB
// compressed (estargz's default chunk is 4 MiB of file).
const MaxRange = 64 << 20

// maxRangeLine bounds a request or answer line.
const maxRangeLine = 4 << 10

// RangeRequest asks berthd for the bytes [Start, End) of Layer's blob.
type RangeRequest struct {
	Layer string `json:"layer"` // chain ID
	Start int64  `json:"start"`
	End   int64  `json:"end"`
}

type rangeAnswer struct {
	Size  int64  `json:"size,omitempty"`
	Error string `json:"error,omitempty"`
	// Final: berthd retried the registry itself (its configured
	// retries); the server fails the read instead of asking again. An
	// error that is not final (a layer berthd does not serve yet, as
	// while it takes its layers up after a restart) is asked again.
	Final bool `json:"final,omitempty"`
}

// ErrNoBerthd: a chunk is not on disk and the layer names no berthd.
var ErrNoBerthd = errors.New("lazy layer: chunk not on disk and no berthd to ask")

// source is a layer's blob as a server reads it: its tail (the TOC) from
// toc.gz, anything else from berthd.
type source struct {
	id      string
	meta    *Meta
	tail    *os.File // nil: none on disk
	tailOff int64
}

func openSource(id, dir string, meta *Meta) (*source, error) {
	s := &source{id: id, meta: meta}
	f, err := os.Open(filepath.Join(dir, TOCFile))
	if os.IsNotExist(err) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lazy layer %s: %w", dir, err)
	}
	st, err := f.Stat()
	if err != nil || st.Size() > meta.Size {
		f.Close()
		return nil, fmt.Errorf("lazy layer %s: %s is not the tail of a blob of %d bytes (%v)", dir, TOCFile, meta.Size, err)
	}
	s.tail, s.tailOff = f, meta.Size-st.Size()
	return s, nil
}

func (s *source) Size() int64 { return s.meta.Size }

func (s *source) close() {
	if s.tail != nil {
		s.tail.Close()
	}
}

func (s *source) OpenRange(ctx context.Context, start, end int64) (io.ReadCloser, error) {
	if s.tail != nil && start >= s.tailOff && end <= s.meta.Size {
		return io.NopCloser(io.NewSectionReader(s.tail, start-s.tailOff, end-start)), nil
	}
	if s.meta.Socket == "" {
		return nil, ErrNoBerthd
	}
	return AskRange(ctx, s.meta.Socket, RangeRequest{Layer: s.id, Start: start, End: end})
}

// AskRange asks berthd at socket for a range; the body has exactly
// End-Start bytes (a short one is an error of its read).
func AskRange(ctx context.Context, socket string, req RangeRequest) (io.ReadCloser, error) {
	if req.Start < 0 || req.End <= req.Start || req.End-req.Start > MaxRange {
		return nil, fmt.Errorf("range %d-%d: out of bounds", req.Start, req.End)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("ask berthd for a chunk: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	fail := func(err error) (io.ReadCloser, error) {
		stop()
		conn.Close()
		return nil, fmt.Errorf("ask berthd for bytes %d-%d of layer %s: %w", req.Start, req.End-1, req.Layer, err)
	}
	line, err := json.Marshal(req)
	if err != nil {
		return fail(err)
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return fail(err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	var ans rangeAnswer
	if err := readLine(br, &ans); err != nil {
		return fail(err)
	}
	if ans.Error != "" && ans.Final {
		return fail(fmt.Errorf("%w: %s", lazy.ErrGivenUp, ans.Error))
	}
	if ans.Error != "" {
		return fail(errors.New(ans.Error))
	}
	if ans.Size != req.End-req.Start {
		return fail(fmt.Errorf("berthd answers %d bytes", ans.Size))
	}
	return &rangeBody{r: io.LimitReader(br, ans.Size), conn: conn, stop: stop}, nil
}

type rangeBody struct {
	r    io.Reader
	conn net.Conn
	stop func() bool
}

func (b *rangeBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *rangeBody) Close() error {
	b.stop()
	return b.conn.Close()
}

// readLine reads one JSON line of at most maxRangeLine bytes into v. A
// line cut short (no newline before EOF or the read deadline) is an
// error, not a line: bufio's ReadLine would hand it over as one.
func readLine(br *bufio.Reader, v any) error {
	var line []byte
	for {
		part, err := br.ReadSlice('\n')
		line = append(line, part...)
		if err == nil {
			line = line[:len(line)-1]
		}
		if len(line) > maxRangeLine {
			return fmt.Errorf("line over %d bytes", maxRangeLine)
		}
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			if len(line) > 0 {
				return fmt.Errorf("line cut short after %d bytes: %w", len(line), noEOF(err))
			}
			return err
		}
	}
	return json.Unmarshal(line, v)
}

// noEOF: a line cut short by EOF is io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Defaults of a RangeServer's bounds.
const (
	// RangeReadTimeout bounds how long berthd waits for a request line.
	RangeReadTimeout = 10 * time.Second
	// RangeWriteTimeout bounds how long one write of an answer may wait
	// for the client to read: a client that stops reading mid-body is
	// dropped, not kept with its registry body open.
	RangeWriteTimeout = 30 * time.Second
	// RangeMaxConns bounds the connections served at once; more wait in
	// the socket's backlog. berth-lazy opens one per chunk it reads, far
	// fewer than this.
	RangeMaxConns = 1024
)

// RangeServer answers range requests (berthd's side), each connection on
// a goroutine of its own.
type RangeServer struct {
	// Source names the blob of a layer berthd serves (false: not one, or
	// not yet), whose OpenRange reads the registry, retrying as
	// configured: its failure is final for the server.
	Source func(layer string) (lazy.Source, bool)
	Log    *slog.Logger
	// ReadTimeout bounds the wait for a connection's request line; 0:
	// RangeReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write to the client; 0: RangeWriteTimeout.
	WriteTimeout time.Duration
	// MaxConns bounds the connections served at once; 0: RangeMaxConns.
	MaxConns int
}

// ServeRanges answers range requests on ln with a RangeServer of source
// until ln is closed.
func ServeRanges(ctx context.Context, ln net.Listener, log *slog.Logger, source func(layer string) (lazy.Source, bool)) error {
	return (&RangeServer{Source: source, Log: log}).Serve(ctx, ln)
}

// Serve answers range requests on ln until ln is closed; cancelling ctx
// ends the answers under way (their connections are closed).
func (rs *RangeServer) Serve(ctx context.Context, ln net.Listener) error {
	maxConns := rs.MaxConns
	if maxConns <= 0 {
		maxConns = RangeMaxConns
	}
	// Accept waits for a free slot: a closed connection frees its own.
	ln = netutil.LimitListener(ln, maxConns)
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("lazy range socket: %w", err)
		}
		go rs.serve(ctx, conn)
	}
}

func (rs *RangeServer) serve(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A client that stops reading would otherwise hold its goroutine
	// (and the registry's body) past berthd's Close.
	defer context.AfterFunc(ctx, func() { conn.Close() })()
	timeout := rs.ReadTimeout
	if timeout <= 0 {
		timeout = RangeReadTimeout
	}
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	writeTimeout := rs.WriteTimeout
	if writeTimeout <= 0 {
		writeTimeout = RangeWriteTimeout
	}
	out := deadlineWriter{conn: conn, timeout: writeTimeout}
	answer := func(a rangeAnswer) bool {
		line, _ := json.Marshal(a)
		_, err := out.Write(append(line, '\n'))
		return err == nil
	}
	br := bufio.NewReaderSize(conn, maxRangeLine)
	var req RangeRequest
	if err := readLine(br, &req); err != nil {
		if !errors.Is(err, io.EOF) {
			rs.Log.Warn("lazy range socket: bad request", "error", err)
			answer(rangeAnswer{Error: "bad request: " + err.Error()})
		}
		return
	}
	src, ok := rs.Source(req.Layer)
	switch {
	case !ok:
		answer(rangeAnswer{Error: "no such lazy layer"})
		return
	case req.Start < 0 || req.End <= req.Start || req.End > src.Size() || req.End-req.Start > MaxRange:
		answer(rangeAnswer{Error: fmt.Sprintf("range %d-%d out of bounds", req.Start, req.End)})
		return
	}
	body, err := src.OpenRange(ctx, req.Start, req.End)
	if err != nil {
		// source retried the registry as configured: the server fails
		// the read with EIO.
		answer(rangeAnswer{Error: err.Error(), Final: true})
		return
	}
	defer body.Close()
	if !answer(rangeAnswer{Size: req.End - req.Start}) {
		return
	}
	// A short body leaves the server short: it retries.
	if _, err := io.CopyN(out, body, req.End-req.Start); err != nil {
		rs.Log.Warn("lazy range socket: send range", "layer", req.Layer, "error", err)
	}
}

// deadlineWriter writes to conn, each write bounded by timeout from its
// start (a body of MaxRange is many writes, each of which may wait on
// the registry before it, so one deadline for the whole would be wrong).
type deadlineWriter struct {
	conn    net.Conn
	timeout time.Duration
}

func (w deadlineWriter) Write(p []byte) (int, error) {
	if err := w.conn.SetWriteDeadline(time.Now().Add(w.timeout)); err != nil {
		return 0, err
	}
	return w.conn.Write(p)
}
