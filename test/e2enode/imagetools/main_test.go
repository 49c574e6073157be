package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

func TestExpand(t *testing.T) {
	now := time.Date(2026, 11, 26, 5, 7, 9, 123456789, time.UTC)
	for format, want := range map[string]string{
		"%3t":     "05:07:09.123",
		"%t":      "05:07:09",
		"at %6t!": "at 05:07:09.123456!",
		"100%":    "100%",
		"%x":      "%x",
	} {
		if got := expand(format, now); got != want {
			t.Errorf("expand(%q) = %q, want %q", format, got, want)
		}
	}
}

func TestCurl(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == "/from" {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprint(w, host)
			return
		}
		fmt.Fprint(w, "host-a")
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	if code := curl([]string{"-g", "-q", "-s", "--max-time", "15", "--connect-timeout", "1", srv.URL + "/hostName"}, &out, &errOut); code != 0 || out.String() != "host-a" {
		t.Fatalf("curl = %d, %q (%s)", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := curl([]string{"-o", "/dev/null", "-i", "-q", "-s", "-w", "%{http_code}", srv.URL + "/missing"}, &out, &errOut); code != 0 || out.String() != "404" {
		t.Fatalf("curl -w = %d, %q", code, out.String())
	}
	out.Reset()
	if code := curl([]string{"-i", srv.URL}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "HTTP/1.1 200 OK\r\n") {
		t.Fatalf("curl -i = %d, %q", code, out.String())
	}
	// --interface ADDRESS: the source address (the HostPort spec's
	// check of a hostIP 127.0.0.1 port from the node's address).
	out.Reset()
	if code := curl([]string{"-g", "--connect-timeout", "5", "--interface", "127.0.0.2", srv.URL + "/from"}, &out, &errOut); code != 0 || out.String() != "127.0.0.2" {
		t.Fatalf("curl --interface 127.0.0.2 = %d, %q (%s)", code, out.String(), errOut.String())
	}
	// --interface NAME binds to the device (SO_BINDTODEVICE needs CAP_NET_RAW).
	if os.Geteuid() == 0 {
		out.Reset()
		if code := curl([]string{"--interface", "lo", srv.URL + "/from"}, &out, &errOut); code != 0 || out.String() != "127.0.0.1" {
			t.Fatalf("curl --interface lo = %d, %q (%s)", code, out.String(), errOut.String())
		}
	}
	srv.Close()
	if code := curl([]string{"-s", "--connect-timeout", "1", srv.URL}, &out, &errOut); code != 7 {
		t.Fatalf("curl to a closed port = %d, want 7", code)
	}
}

func TestSimpleCommand(t *testing.T) {
	for script, want := range map[string]string{
		"env":                     "env",
		"sleep 10":                "sleep,10",
		"/agnhost serve-hostname": "/agnhost,serve-hostname",
		"echo $HOME":              "",
		"A=1 env":                 "",
		"env; env":                "",
		"cat /x > /y":             "",
		"echo 'a b'":              "",
		"":                        "",
	} {
		words, ok := simpleCommand(script)
		if got := strings.Join(words, ","); ok != (want != "") || got != want {
			t.Errorf("simpleCommand(%q) = %q, %v; want %q", script, got, ok, want)
		}
	}
}

// TestNCVerboseTCP: the cluster suite's Service checks run
// `echo hostName | nc -v -t -w 2 IP PORT` and read the server's reply.
func TestNCVerboseTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("pod-a"))
		c.Close()
	}()
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	stdout, stderr := os.Stdout, os.Stderr
	or, ow, _ := os.Pipe()
	er, ew, _ := os.Pipe()
	os.Stdout, os.Stderr = ow, ew
	err = nc([]string{"-v", "-t", "-w", "2", host, port})
	os.Stdout, os.Stderr = stdout, stderr
	ow.Close()
	ew.Close()
	if err != nil {
		t.Fatalf("nc: %v", err)
	}
	out, _ := io.ReadAll(or)
	msg, _ := io.ReadAll(er)
	if string(out) != "pod-a" {
		t.Errorf("stdout %q, want the server's reply", out)
	}
	if !strings.Contains(string(msg), "succeeded") {
		t.Errorf("stderr %q, want netcat's -v line", msg)
	}
}
