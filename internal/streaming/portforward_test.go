package streaming

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/netns"
)

// echoInNetns listens on 127.0.0.1:0 inside the namespace and answers each
// connection with "pong:" + everything it read until EOF.
func echoInNetns(t *testing.T, pin string) int32 {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(pin, func() error {
		var err error
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				c.Write(append([]byte("pong:"), b...))
			}()
		}
	}()
	return int32(ln.Addr().(*net.TCPAddr).Port)
}

// pipeStream is a client side that sends a fixed request and then EOF, and
// collects the reply.
type pipeStream struct {
	io.Reader
	reply  bytes.Buffer
	closed chan struct{}
}

func (p *pipeStream) Write(b []byte) (int, error) { return p.reply.Write(b) }
func (p *pipeStream) Close() error                { close(p.closed); return nil }

func TestPortForwardReachesALoopbackListenerInsideThePodNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pin := netns.NewForTest(t)
	port := echoInNetns(t, pin)
	for i := 0; i < 3; i++ { // several connections, one after another
		stream := &pipeStream{Reader: strings.NewReader(fmt.Sprintf("ping%d", i)), closed: make(chan struct{})}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := PortForward(ctx, pin, port, stream)
		cancel()
		if err != nil {
			t.Fatalf("port-forward %d: %v", i, err)
		}
		if got, want := stream.reply.String(), fmt.Sprintf("pong:ping%d", i); got != want {
			t.Fatalf("reply %q, want %q", got, want)
		}
		select {
		case <-stream.closed:
		default:
			t.Fatal("stream not closed after the session")
		}
	}
	// The listener lives only in the pod's namespace.
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), 200*time.Millisecond); err == nil {
		c.Close()
		t.Log("host also listens on that port; namespace isolation not checked")
	}
}

func TestPortForwardFailsClearlyWhenNothingListens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pin := netns.NewForTest(t)
	client, server := net.Pipe()
	defer client.Close()
	err := PortForward(context.Background(), pin, 1, server)
	if err == nil {
		t.Fatal("port-forward to a closed port succeeded")
	}
}
