package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// curl does what the e2e framework asks of curl in test pods:
//
//	curl -g -q -s --max-time 15 --connect-timeout 1 http://IP:PORT/hostName
//	curl -i -q -s --connect-timeout 1 http://localhost:PORT/path
//	curl -o /dev/null -i -q -s -w %{http_code} --connect-timeout 1 URL
//	curl -g --connect-timeout 5 --interface NODE-IP http://127.0.0.1:PORT/hostname
//
// plus -k, -X, -H, -d, -L, -f. --interface takes an address (the source
// address, as the HostPort spec uses it) or an interface name
// (SO_BINDTODEVICE). It returns curl's exit codes for the
// failures the checks tell apart: 6 no host, 7 no connection, 28 timeout,
// 22 an HTTP error with -f.
func curl(args []string, stdout, stderr io.Writer) int {
	var (
		url, method, data, output, writeOut, iface string
		include, insecure, fail, follow            bool
		maxTime, connectTimeout                    time.Duration
		headers                                    []string
	)
	secs := func(v string) (time.Duration, error) {
		f, err := strconv.ParseFloat(v, 64)
		return time.Duration(f * float64(time.Second)), err
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("option %s needs a value", a)
			}
			i++
			return args[i], nil
		}
		var err error
		switch a {
		case "-g", "--globoff", "-q", "--disable", "-s", "--silent", "-S", "--show-error", "-v":
		case "-i", "--include":
			include = true
		case "-k", "--insecure":
			insecure = true
		case "-f", "--fail":
			fail = true
		case "-L", "--location":
			follow = true
		case "-m", "--max-time":
			var v string
			if v, err = next(); err == nil {
				maxTime, err = secs(v)
			}
		case "--connect-timeout":
			var v string
			if v, err = next(); err == nil {
				connectTimeout, err = secs(v)
			}
		case "--interface":
			iface, err = next()
		case "-X", "--request":
			method, err = next()
		case "-H", "--header":
			var v string
			v, err = next()
			headers = append(headers, v)
		case "-d", "--data":
			data, err = next()
		case "-o", "--output":
			output, err = next()
		case "-w", "--write-out":
			writeOut, err = next()
		default:
			if strings.HasPrefix(a, "-") {
				err = fmt.Errorf("option %s: not supported by this stand-in", a)
			} else {
				url = a
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "curl: %v\n", err)
			return 2
		}
	}
	if url == "" {
		fmt.Fprintln(stderr, "curl: no URL specified")
		return 2
	}
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	if method == "" {
		method = http.MethodGet
		if data != "" {
			method = http.MethodPost
		}
	}
	ctx := context.Background()
	if maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxTime)
		defer cancel()
	}
	dialer := &net.Dialer{Timeout: connectTimeout}
	if ip := net.ParseIP(iface); ip != nil {
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	} else if iface != "" {
		dialer.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = syscall.BindToDevice(int(fd), iface) }); err != nil {
				return err
			}
			return serr
		}
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:     dialer.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure}, //nolint:gosec // curl -k, in test pods
	}}
	if !follow {
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	var body io.Reader
	if data != "" {
		body = strings.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		fmt.Fprintf(stderr, "curl: (3) %v\n", err)
		return 3
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if data != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := client.Do(req)
	if err != nil {
		code := 7
		var dnsErr *net.DNSError
		var netErr net.Error
		switch {
		case ctx.Err() != nil || (asError(err, &netErr) && netErr.Timeout()):
			code = 28
		case asError(err, &dnsErr):
			code = 6
		}
		fmt.Fprintf(stderr, "curl: (%d) %v\n", code, err)
		if writeOut != "" {
			fmt.Fprint(stdout, strings.ReplaceAll(writeOut, "%{http_code}", "000"))
		}
		return code
	}
	defer resp.Body.Close()
	out := stdout
	if output != "" && output != "-" {
		f, err := os.Create(output)
		if err != nil {
			fmt.Fprintf(stderr, "curl: (23) %v\n", err)
			return 23
		}
		defer f.Close()
		out = f
	}
	if fail && resp.StatusCode >= 400 {
		fmt.Fprintf(stderr, "curl: (22) The requested URL returned error: %d\n", resp.StatusCode)
		return 22
	}
	if include {
		fmt.Fprintf(out, "%s %s\r\n", resp.Proto, resp.Status)
		_ = resp.Header.Write(out)
		fmt.Fprint(out, "\r\n")
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		fmt.Fprintf(stderr, "curl: (56) %v\n", err)
		return 56
	}
	if writeOut != "" {
		fmt.Fprint(stdout, strings.ReplaceAll(writeOut, "%{http_code}", strconv.Itoa(resp.StatusCode)))
	}
	return 0
}
