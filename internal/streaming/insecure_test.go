package streaming

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestNewWarnsWhenPlainHTTPLeavesLoopback: berthd says so at start when
// the streaming server listens beyond loopback without TLS (issue 34,
// finding 11), and not otherwise.
func TestNewWarnsWhenPlainHTTPLeavesLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		warn bool
	}{
		{"127.0.0.1:0", false},
		{"0.0.0.0:0", true},
	} {
		var buf bytes.Buffer
		s, err := New(tc.addr, nil, nil, nil, slog.New(slog.NewTextHandler(&buf, nil)))
		if err != nil {
			t.Fatal(err)
		}
		s.ln.Close()
		if got := strings.Contains(buf.String(), "beyond loopback without TLS"); got != tc.warn {
			t.Errorf("New(%s): warned %v, want %v; log: %s", tc.addr, got, tc.warn, buf.String())
		}
	}
}
