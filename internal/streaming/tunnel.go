package streaming

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// spdyTunnelPrefix marks a websocket subprotocol carrying SPDY: newer
// kubectl and critest's websocket mode tunnel the SPDY port-forward
// protocol through websocket binary messages (KEP-4006) instead of using
// the v4 channel protocol. The kubelet streaming library serves only the
// latter, so berth unwraps the tunnel and hands the library a plain SPDY
// upgrade.
const spdyTunnelPrefix = "SPDY/3.1+"

// tunnelProtocol returns the tunnelled protocol a websocket request asks
// for ("portforward.k8s.io"), or "" when it is not a tunnel request.
func tunnelProtocol(r *http.Request) string {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return ""
	}
	for _, p := range websocket.Subprotocols(r) {
		if strings.HasPrefix(p, spdyTunnelPrefix) {
			return p
		}
	}
	return ""
}

// serveTunnel accepts the websocket, then replays the request to next as
// a SPDY upgrade whose hijacked connection is the websocket stream.
func serveTunnel(w http.ResponseWriter, r *http.Request, subprotocol string, next http.Handler) {
	up := websocket.Upgrader{
		Subprotocols: []string{subprotocol},
		// The URL carries a single-use token from an authorised CRI call;
		// the kubelet's own streaming server does not check origins either.
		CheckOrigin:     func(*http.Request) bool { return true },
		ReadBufferSize:  32 * 1024,
		WriteBufferSize: 32 * 1024,
	}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade already answered the client
	}
	conn := &wsConn{ws: ws}
	defer conn.Close()

	inner := r.Clone(r.Context())
	inner.Method = http.MethodPost
	for _, h := range []string{"Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Protocol", "Sec-Websocket-Extensions"} {
		inner.Header.Del(h)
	}
	inner.Header.Set("Connection", "Upgrade")
	inner.Header.Set("Upgrade", "SPDY/3.1")
	inner.Header.Set("X-Stream-Protocol-Version", strings.TrimPrefix(subprotocol, spdyTunnelPrefix))
	next.ServeHTTP(&tunnelWriter{conn: conn, header: http.Header{}}, inner)
}

// tunnelWriter is the ResponseWriter the SPDY upgrade sees: headers and the
// 101 status are swallowed (the websocket handshake already answered), and
// Hijack hands over the tunnel.
type tunnelWriter struct {
	conn   *wsConn
	header http.Header
}

func (t *tunnelWriter) Header() http.Header         { return t.header }
func (t *tunnelWriter) WriteHeader(int)             {}
func (t *tunnelWriter) Write(b []byte) (int, error) { return len(b), nil }

func (t *tunnelWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return t.conn, bufio.NewReadWriter(bufio.NewReader(t.conn), bufio.NewWriter(t.conn)), nil
}

// wsConn is a net.Conn over websocket binary messages.
type wsConn struct {
	ws      *websocket.Conn
	mu      sync.Mutex // serialises writers
	reader  io.Reader  // the message being read
	closeMu sync.Once
}

func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.reader == nil {
			typ, r, err := c.ws.NextReader()
			if err != nil {
				if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
					return 0, io.EOF
				}
				return 0, err
			}
			if typ != websocket.BinaryMessage {
				continue
			}
			c.reader = r
		}
		n, err := c.reader.Read(p)
		if err == io.EOF {
			c.reader = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error {
	var err error
	c.closeMu.Do(func() {
		c.mu.Lock()
		_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		c.mu.Unlock()
		err = c.ws.Close()
	})
	return err
}

func (c *wsConn) LocalAddr() net.Addr  { return c.ws.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr { return c.ws.RemoteAddr() }
func (c *wsConn) SetDeadline(t time.Time) error {
	c.ws.SetReadDeadline(t)
	return c.ws.SetWriteDeadline(t)
}
func (c *wsConn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *wsConn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }
