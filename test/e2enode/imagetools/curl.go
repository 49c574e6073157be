package main

import (
	"context"
	"crypto/tls"
	"errors"
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
	o, err := parseCurl(args)
	if err != nil {
		fmt.Fprintf(stderr, "curl: %v\n", err)
		return 2
	}
	ctx := context.Background()
	if o.maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.maxTime)
		defer cancel()
	}
	req, err := o.request(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "curl: (3) %v\n", err)
		return 3
	}
	resp, err := o.client().Do(req)
	if err != nil {
		code := transferCode(ctx, err)
		fmt.Fprintf(stderr, "curl: (%d) %v\n", code, err)
		if o.writeOut != "" {
			fmt.Fprint(stdout, strings.ReplaceAll(o.writeOut, "%{http_code}", "000"))
		}
		return code
	}
	defer resp.Body.Close()
	return o.write(resp, stdout, stderr)
}

// curlOptions is a curl command line, parsed.
type curlOptions struct {
	url, method, data, output, writeOut, iface string
	include, insecure, fail, follow            bool
	maxTime, connectTimeout                    time.Duration
	headers                                    []string
}

// parseCurl reads curl's options and its URL (http:// unless it names a
// scheme), the method defaulting to GET, or POST with -d.
func parseCurl(args []string) (curlOptions, error) {
	var o curlOptions
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
			o.include = true
		case "-k", "--insecure":
			o.insecure = true
		case "-f", "--fail":
			o.fail = true
		case "-L", "--location":
			o.follow = true
		case "-m", "--max-time":
			var v string
			if v, err = next(); err == nil {
				o.maxTime, err = secs(v)
			}
		case "--connect-timeout":
			var v string
			if v, err = next(); err == nil {
				o.connectTimeout, err = secs(v)
			}
		case "--interface":
			o.iface, err = next()
		case "-X", "--request":
			o.method, err = next()
		case "-H", "--header":
			var v string
			v, err = next()
			o.headers = append(o.headers, v)
		case "-d", "--data":
			o.data, err = next()
		case "-o", "--output":
			o.output, err = next()
		case "-w", "--write-out":
			o.writeOut, err = next()
		default:
			if strings.HasPrefix(a, "-") {
				err = fmt.Errorf("option %s: not supported by this stand-in", a)
			} else {
				o.url = a
			}
		}
		if err != nil {
			return o, err
		}
	}
	if o.url == "" {
		return o, errors.New("no URL specified")
	}
	if !strings.Contains(o.url, "://") {
		o.url = "http://" + o.url
	}
	if o.method == "" {
		o.method = http.MethodGet
		if o.data != "" {
			o.method = http.MethodPost
		}
	}
	return o, nil
}

// client dials within the connect timeout, from --interface's address or
// on its device, and follows redirects only with -L.
func (o curlOptions) client() *http.Client {
	dialer := &net.Dialer{Timeout: o.connectTimeout}
	if ip := net.ParseIP(o.iface); ip != nil {
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	} else if o.iface != "" {
		dialer.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = syscall.BindToDevice(int(fd), o.iface) }); err != nil {
				return err
			}
			return serr
		}
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:     dialer.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: o.insecure}, //nolint:gosec // curl -k, in test pods
	}}
	if !o.follow {
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	return client
}

// request is the request the options describe: -H's headers, -d's body
// form-encoded unless a header says otherwise.
func (o curlOptions) request(ctx context.Context) (*http.Request, error) {
	var body io.Reader
	if o.data != "" {
		body = strings.NewReader(o.data)
	}
	req, err := http.NewRequestWithContext(ctx, o.method, o.url, body)
	if err != nil {
		return nil, err
	}
	for _, h := range o.headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if o.data != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return req, nil
}

// transferCode is curl's exit code for a request that got no response:
// 28 timed out, 6 no such host, else 7 no connection.
func transferCode(ctx context.Context, err error) int {
	var dnsErr *net.DNSError
	var netErr net.Error
	switch {
	case ctx.Err() != nil || (asError(err, &netErr) && netErr.Timeout()):
		return 28
	case asError(err, &dnsErr):
		return 6
	}
	return 7
}

// write writes resp to -o's file or stdout (with its status line and
// headers for -i), and -w's http_code to stdout; with -f an HTTP error
// writes nothing and is 22.
func (o curlOptions) write(resp *http.Response, stdout, stderr io.Writer) int {
	out := stdout
	if o.output != "" && o.output != "-" {
		f, err := os.Create(o.output)
		if err != nil {
			fmt.Fprintf(stderr, "curl: (23) %v\n", err)
			return 23
		}
		defer f.Close()
		out = f
	}
	if o.fail && resp.StatusCode >= 400 {
		fmt.Fprintf(stderr, "curl: (22) The requested URL returned error: %d\n", resp.StatusCode)
		return 22
	}
	if o.include {
		fmt.Fprintf(out, "%s %s\r\n", resp.Proto, resp.Status)
		_ = resp.Header.Write(out)
		fmt.Fprint(out, "\r\n")
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		fmt.Fprintf(stderr, "curl: (56) %v\n", err)
		return 56
	}
	if o.writeOut != "" {
		fmt.Fprint(stdout, strings.ReplaceAll(o.writeOut, "%{http_code}", strconv.Itoa(resp.StatusCode)))
	}
	return 0
}
