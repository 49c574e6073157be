package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

// asError is errors.As, named for the call sites above.
func asError[T any](err error, target *T) bool { return errors.As(err, target) }

// nc is netcat's client mode as the e2e framework uses it
// (echo hostName | nc -w 1 -u IP PORT; the cluster suite's Service
// checks: nc -v -t -w 2 IP PORT): -u for UDP, -t for TCP (the default),
// -v to say on stderr that the TCP connection succeeded (as OpenBSD
// netcat, which upstream's agnhost image has), -w for how long to wait for
// a connection and for a reply. Any other use (-l, -e, -z ...) goes to
// busybox's nc.
func nc(args []string) error {
	udp, verbose := false, false
	wait := time.Duration(0)
	var rest []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-u":
			udp = true
		case a == "-t":
			udp = false
		case a == "-v":
			verbose = true
		case a == "-w" && i+1 < len(args):
			i++
			n, err := strconv.Atoi(args[i])
			if err != nil {
				return fmt.Errorf("bad -w %q", args[i])
			}
			wait = time.Duration(n) * time.Second
		case len(a) > 2 && a[:2] == "-w":
			n, err := strconv.Atoi(a[2:])
			if err != nil {
				return fmt.Errorf("bad %s", a)
			}
			wait = time.Duration(n) * time.Second
		case len(a) > 0 && a[0] == '-':
			return busyboxNC(args)
		default:
			rest = append(rest, a)
		}
	}
	if len(rest) != 2 {
		return busyboxNC(args)
	}
	addr := net.JoinHostPort(rest[0], rest[1])
	if !udp {
		conn, err := net.DialTimeout("tcp", addr, wait)
		if err != nil {
			return err
		}
		defer conn.Close()
		if verbose {
			fmt.Fprintf(os.Stderr, "Connection to %s %s port [tcp/*] succeeded!\n", rest[0], rest[1])
		}
		go func() {
			_, _ = io.Copy(conn, os.Stdin)
			_ = conn.(*net.TCPConn).CloseWrite()
		}()
		if wait > 0 {
			_ = conn.SetReadDeadline(time.Now().Add(wait))
		}
		_, err = io.Copy(os.Stdout, conn)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		return err
	}
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	if _, err := conn.Write(in); err != nil {
		return err
	}
	// Replies until -w seconds pass without one (netcat's idle timeout).
	buf := make([]byte, 65536)
	for {
		if wait > 0 {
			_ = conn.SetReadDeadline(time.Now().Add(wait))
		}
		n, err := conn.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) {
				return nil
			}
			return err
		}
		if _, err := os.Stdout.Write(buf[:n]); err != nil {
			return err
		}
	}
}

// busyboxNC runs busybox's nc with the same arguments.
func busyboxNC(args []string) error {
	return syscall.Exec("/bin/busybox", append([]string{"nc"}, args...), os.Environ())
}
