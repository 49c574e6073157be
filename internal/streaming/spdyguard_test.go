package streaming

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/moby/spdystream/spdy"
)

// guardRead passes wire through a guard and returns what the library
// would read, and the error that ended it.
func guardRead(t *testing.T, wire []byte) ([]byte, error) {
	t.Helper()
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		_, _ = client.Write(wire)
		client.Close()
	}()
	g := &spdyGuardConn{Conn: server, r: server, done: make(chan struct{})}
	defer g.Close()
	var got bytes.Buffer
	_, err := io.Copy(&got, g)
	return got.Bytes(), err
}

// TestSPDYGuardPassesWhatClientsSend: the frames a real client writes
// (spdystream's own framer, as client-go uses it) reach the library
// unchanged, header blocks of one zlib stream across frames included.
func TestSPDYGuardPassesWhatClientsSend(t *testing.T) {
	var wire bytes.Buffer
	f, err := spdy.NewFramer(&wire, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	for i, typ := range []string{"error", "stdout", "stderr", "stdin", "resize"} {
		h := http.Header{}
		h.Set("streamType", typ)
		h.Set("requestID", "1")
		h.Set("x-long", strings.Repeat("v", 8<<10))
		if err := f.WriteFrame(&spdy.SynStreamFrame{StreamId: spdy.StreamId(2*i + 1), Headers: h}); err != nil {
			t.Fatal(err)
		}
		if err := f.WriteFrame(&spdy.DataFrame{StreamId: spdy.StreamId(2*i + 1), Data: bytes.Repeat([]byte{byte(i)}, 100<<10)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.WriteFrame(&spdy.PingFrame{Id: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := guardRead(t, wire.Bytes())
	if err != nil {
		t.Fatalf("guard refused a client's frames: %v", err)
	}
	if !bytes.Equal(got, wire.Bytes()) {
		t.Fatalf("guard changed the frames: %d bytes in, %d out", wire.Len(), len(got))
	}
}

// TestSPDYGuardRefusesBombs: an oversized control frame and a header
// block that inflates beyond the bound end the connection before the
// library sees the frame.
func TestSPDYGuardRefusesBombs(t *testing.T) {
	control := func(typ uint16, payload []byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, 0x80030000|uint32(typ))
		b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
		return append(b, payload...)
	}
	var block bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&block, zlib.BestCompression)
	_, _ = zw.Write(binary.BigEndian.AppendUint32(nil, 1))
	_, _ = zw.Write(binary.BigEndian.AppendUint32(nil, 1))
	_, _ = zw.Write([]byte("a"))
	_, _ = zw.Write(binary.BigEndian.AppendUint32(nil, 8<<20))
	_, _ = zw.Write(bytes.Repeat([]byte{'a'}, 8<<20))
	_ = zw.Flush()
	synStream := append([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0}, block.Bytes()...)
	for name, wire := range map[string][]byte{
		"big control frame": control(4, make([]byte, maxSPDYControlFrame+1)),
		"header bomb":       control(1, synStream),
		"settings count":    control(4, binary.BigEndian.AppendUint32(nil, 1<<31))[:12+4],
		"headers bomb":      control(8, synStream[6:]),
	} {
		got, err := guardRead(t, wire)
		if !errors.Is(err, errSPDYRefused) || len(got) != 0 {
			t.Errorf("%s: passed %d bytes, error %v; want it refused", name, len(got), err)
		}
	}
}
