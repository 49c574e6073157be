package lazysrv_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
)

// The range socket's server against hostile clients, on a real unix
// socket: each bound of the protocol (ranges.go) refuses what passes it
// with a clear answer, and the server goes on answering good requests.

const (
	goodLayer = "sha256:good"
	blobSize  = 2 * lazysrv.MaxRange // so that a range over MaxRange fits in it
	// hangGuard ends a test whose bound is gone instead of waiting for go
	// test's timeout; a passing test never comes near it.
	hangGuard = 2 * time.Minute
)

// patternSource is a blob of size bytes, byte i being byte(i%251),
// made as it is read.
type patternSource struct{ size int64 }

func (p patternSource) Size() int64 { return p.size }

func (p patternSource) OpenRange(_ context.Context, start, end int64) (io.ReadCloser, error) {
	if start < 0 || end > p.size || end <= start {
		return nil, fmt.Errorf("patternSource: no bytes %d-%d in %d", start, end, p.size)
	}
	return io.NopCloser(&patternReader{off: start, end: end}), nil
}

type patternReader struct{ off, end int64 }

func (r *patternReader) Read(b []byte) (int, error) {
	if r.off >= r.end {
		return 0, io.EOF
	}
	n := min(int64(len(b)), r.end-r.off)
	for i := range n {
		b[i] = byte((r.off + i) % 251)
	}
	r.off += n
	return int(n), nil
}

// serveRanges serves goodLayer on a new socket until the test ends.
func serveRanges(t *testing.T, readTimeout time.Duration) string {
	t.Helper()
	return serveRangesWith(t, lazysrv.RangeServer{ReadTimeout: readTimeout})
}

// serveRangesWith serves goodLayer with rs's bounds on a new socket until
// the test ends.
func serveRangesWith(t *testing.T, rs lazysrv.RangeServer) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "lazy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs.Source = func(layer string) (lazy.Source, bool) {
		return patternSource{blobSize}, layer == goodLayer
	}
	rs.Log = slog.New(slog.DiscardHandler)
	done := make(chan error, 1)
	go func() { done <- rs.Serve(ctx, ln) }()
	t.Cleanup(func() {
		ln.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return sock
}

// askGood asks for a range of goodLayer as berth-lazy does and checks
// the bytes.
func askGood(t *testing.T, sock string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	const start, end = 1000, 1000 + 8192
	body, err := lazysrv.AskRange(ctx, sock, lazysrv.RangeRequest{Layer: goodLayer, Start: start, End: end})
	if err != nil {
		t.Fatalf("a good request after: %v", err)
	}
	defer body.Close()
	got, err := io.ReadAll(body)
	want, _ := io.ReadAll(&patternReader{off: start, end: end})
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a good request after: %d bytes, %v; want %d bytes of the blob", len(got), err, len(want))
	}
}

type answer struct {
	Size  int64  `json:"size"`
	Error string `json:"error"`
	Final bool   `json:"final"`
}

// readAnswer reads the server's answer line on conn, then expects the
// connection closed (nothing else sent).
func readAnswer(t *testing.T, conn net.Conn) answer {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(hangGuard))
	br := bufio.NewReader(conn)
	line, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("no answer line: %q, %v", line, err)
	}
	var a answer
	if err := json.Unmarshal(line, &a); err != nil {
		t.Fatalf("answer %q: %v", line, err)
	}
	// Reset: the server closed with the client's bytes unread.
	if rest, err := io.ReadAll(br); (err != nil && !errors.Is(err, syscall.ECONNRESET)) || len(rest) != 0 {
		t.Errorf("after a refusal: %d bytes, %v; want the connection closed", len(rest), err)
	}
	return a
}

func dial(t *testing.T, sock string) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestServeRangesRefusesALineOverTheBound: 1 MiB with no newline is
// refused once past the 4 KiB bound, without the server reading the rest
// (the client's write fails: nobody takes the bytes), and the server then
// answers a good request.
func TestServeRangesRefusesALineOverTheBound(t *testing.T) {
	sock := serveRanges(t, 0)
	conn := dial(t, sock)
	wrote := make(chan error, 1)
	go func() {
		_, err := conn.Write(bytes.Repeat([]byte("a"), 1<<20))
		wrote <- err
	}()
	a := readAnswer(t, conn)
	if !strings.Contains(a.Error, "bad request: line over 4096 bytes") || a.Final {
		t.Errorf("answer %+v, want a bad request, line over 4096 bytes, not final", a)
	}
	if err := <-wrote; err == nil {
		t.Error("the server took the whole 1 MiB line; want it to stop reading past 4 KiB")
	}
	askGood(t, sock)
}

// TestServeRangesDropsASilentClient: a client that sends nothing, or half
// a line, is answered and closed once the read timeout passes.
func TestServeRangesDropsASilentClient(t *testing.T) {
	sock := serveRanges(t, 100*time.Millisecond)
	for _, sent := range []string{"", `{"layer":"sha256:good","start":0`} {
		conn := dial(t, sock)
		if _, err := io.WriteString(conn, sent); err != nil {
			t.Fatal(err)
		}
		a := readAnswer(t, conn)
		if !strings.Contains(a.Error, "bad request") || !strings.Contains(a.Error, "timeout") || (sent != "" && !strings.Contains(a.Error, "line cut short")) {
			t.Errorf("sent %q then nothing: answer %+v, want a bad request, timeout", sent, a)
		}
	}
}

// TestServeRangesEndsConnectionsOnCancel: berthd's Close (the context
// cancelled) ends the connections under way, not only the listener.
func TestServeRangesEndsConnectionsOnCancel(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "lazy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rs := &lazysrv.RangeServer{
		Source:      func(string) (lazy.Source, bool) { return nil, false },
		Log:         slog.New(slog.DiscardHandler),
		ReadTimeout: time.Hour,
	}
	go rs.Serve(ctx, ln)
	conn := dial(t, sock)
	// Once the server has the connection (a request was answered on one
	// after it), cancel.
	other := dial(t, sock)
	if _, err := io.WriteString(other, `{"layer":"x","start":0,"end":1}`+"\n"); err != nil {
		t.Fatal(err)
	}
	readAnswer(t, other)
	cancel()
	_ = conn.SetReadDeadline(time.Now().Add(hangGuard))
	if n, err := conn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("after cancel: read %d, %v; want EOF", n, err)
	}
}

// TestServeRangesRefusesBadRequests: each bad request gets a clear
// refusal (not final: berth-lazy may ask again), the connection closed,
// and the server answers a good request after it.
func TestServeRangesRefusesBadRequests(t *testing.T) {
	sock := serveRanges(t, 0)
	req := func(layer string, start, end int64) string {
		return fmt.Sprintf(`{"layer":%q,"start":%d,"end":%d}`, layer, start, end)
	}
	pad := func(line string, n int) string { return line + strings.Repeat(" ", n-len(line)) }
	for _, tc := range []struct {
		name, line, says string
		noNewline        bool // the client closes its side instead
	}{
		{"no newline before EOF", req(goodLayer, 0, 10), "line cut short", true},
		{"a line of 4097 bytes", pad(req(goodLayer, 0, 10), 4097), "line over 4096 bytes", false},
		{"malformed JSON", `{"layer":`, "bad request", false},
		{"not JSON", "GET / HTTP/1.0", "bad request", false},
		{"wrong types", `{"layer":1,"start":"0"}`, "bad request", false},
		{"empty line", "", "bad request", false},
		{"unknown layer", req("sha256:other", 0, 10), "no such lazy layer", false},
		{"no layer", `{"start":0,"end":10}`, "no such lazy layer", false},
		{"start < 0", req(goodLayer, -1, 10), "out of bounds", false},
		{"end == start", req(goodLayer, 10, 10), "out of bounds", false},
		{"end < start", req(goodLayer, 10, 5), "out of bounds", false},
		{"end past the blob", req(goodLayer, blobSize-10, blobSize+1), "out of bounds", false},
		{"over MaxRange", req(goodLayer, 0, lazysrv.MaxRange+1), "out of bounds", false},
		{"overflowing", req(goodLayer, -1<<63, 1<<62), "out of bounds", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t, sock)
			line := tc.line + "\n"
			if tc.noNewline {
				line = tc.line
			}
			if _, err := io.WriteString(conn, line); err != nil {
				t.Fatal(err)
			}
			if tc.noNewline {
				if err := conn.(*net.UnixConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			a := readAnswer(t, conn)
			if !strings.Contains(a.Error, tc.says) || a.Final || a.Size != 0 {
				t.Errorf("%s: answer %+v, want %q, not final", tc.line, a, tc.says)
			}
			askGood(t, sock)
		})
	}
	// The blob's last bytes are in bounds, on a line of 4096 bytes.
	conn := dial(t, sock)
	if _, err := io.WriteString(conn, pad(req(goodLayer, blobSize-100, blobSize), 4096)+"\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	line, err := br.ReadBytes('\n')
	var a answer
	if err != nil || json.Unmarshal(line, &a) != nil || a.Size != 100 || a.Error != "" {
		t.Fatalf("the blob's last 100 bytes: %q, %v", line, err)
	}
	if body, err := io.ReadAll(br); err != nil || len(body) != 100 {
		t.Errorf("the blob's last 100 bytes: %d, %v", len(body), err)
	}
}

// TestServeRangesAnswersBesideManyIdleConnections: 200 connections that
// send nothing, and 200 that send half a line, do not keep a good request
// from being answered (each connection is served on its own).
func TestServeRangesAnswersBesideManyIdleConnections(t *testing.T) {
	sock := serveRanges(t, 0)
	for i := range 400 {
		conn := dial(t, sock)
		if i%2 == 1 {
			if _, err := io.WriteString(conn, `{"layer":"sha256:good",`); err != nil {
				t.Fatal(err)
			}
		}
	}
	askGood(t, sock)
}

// TestServeRangesDropsAClientThatStopsReading: a client that asks for
// MaxRange bytes and reads none of them is dropped at the write timeout,
// freeing its slot: with one connection allowed, a good request after it
// is answered, and the stalled client gets far less than it asked for.
func TestServeRangesDropsAClientThatStopsReading(t *testing.T) {
	sock := serveRangesWith(t, lazysrv.RangeServer{MaxConns: 1, WriteTimeout: 200 * time.Millisecond})
	stalled := dial(t, sock)
	if err := json.NewEncoder(stalled).Encode(lazysrv.RangeRequest{Layer: goodLayer, Start: 0, End: lazysrv.MaxRange}); err != nil {
		t.Fatal(err)
	}
	askGood(t, sock)
	_ = stalled.SetReadDeadline(time.Now().Add(hangGuard))
	got, err := io.Copy(io.Discard, stalled)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the stalled client's read: %v", err)
	}
	if got >= lazysrv.MaxRange {
		t.Errorf("the stalled client got %d bytes; want it dropped before the %d it asked for", got, lazysrv.MaxRange)
	}
}

// TestServeRangesBoundsConnectionsAtOnce: with MaxConns held by idle
// clients, one more is not served (it waits in the backlog, its request
// unread) until one of them goes; then it is.
func TestServeRangesBoundsConnectionsAtOnce(t *testing.T) {
	const maxConns = 4
	sock := serveRangesWith(t, lazysrv.RangeServer{MaxConns: maxConns, ReadTimeout: time.Hour})
	var idle []net.Conn
	for range maxConns {
		idle = append(idle, dial(t, sock))
	}
	extra := dial(t, sock)
	if _, err := io.WriteString(extra, `{"layer":"sha256:none","start":0,"end":1}`+"\n"); err != nil {
		t.Fatal(err)
	}
	_ = extra.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := extra.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection %d of %d allowed: read %d, %v; want it not served yet", maxConns+1, maxConns, n, err)
	}
	idle[0].Close()
	if a := readAnswer(t, extra); a.Error != "no such lazy layer" {
		t.Errorf("once a slot freed: answer %+v, want no such lazy layer", a)
	}
}
