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
	"github.com/berthcri/berth/internal/testutil/netnstest"
)

// echoInNetns listens on 127.0.0.1:port (0: any) inside the namespace pin
// ("": the host's) and answers each connection with prefix + everything
// it read until EOF.
func echoInNetns(t *testing.T, pin string, port int, prefix string) int32 {
	t.Helper()
	var ln net.Listener
	listen := func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return err
	}
	var err error
	if pin == "" {
		err = listen()
	} else {
		err = netns.Do(pin, listen)
	}
	if err != nil {
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
				c.Write(append([]byte(prefix), b...))
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
	pin := netnstest.New(t)
	// The host listens on the same address and port as the pod: the
	// forward must reach the pod's listener, never the host's.
	port := echoInNetns(t, "", 0, "host:")
	echoInNetns(t, pin, int(port), "pong:")
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
	// And the host's listener is there, answering as the host.
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))), 5*time.Second)
	if err != nil {
		t.Fatalf("host listener: %v", err)
	}
	defer c.Close()
	c.Write([]byte("x"))
	c.(*net.TCPConn).CloseWrite()
	if b, _ := io.ReadAll(c); string(b) != "host:x" {
		t.Fatalf("host listener answered %q", b)
	}
}

func TestPortForwardFailsClearlyWhenNothingListens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pin := netnstest.New(t)
	client, server := net.Pipe()
	defer client.Close()
	err := PortForward(context.Background(), pin, 1, server)
	if err == nil {
		t.Fatal("port-forward to a closed port succeeded")
	}
}
