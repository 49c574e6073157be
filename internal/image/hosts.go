package image

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// endpoint is one place to pull a registry's images from: a mirror from
// hosts.toml or the upstream server.
type endpoint struct {
	scheme     string // http or https; "" lets go-containerregistry choose
	host       string // host[:port]
	path       string // API prefix, "/v2" unless the config says otherwise
	pull       bool
	resolve    bool
	skipVerify bool
	caFiles    []string
	// clientCerts are [cert, key] pairs; key "" means the cert file holds both.
	clientCerts [][2]string
	dialTimeout time.Duration
	header      http.Header
	upstream    bool
	ns          string // the registry a mirror stands in for (the ?ns= parameter)
}

func (e endpoint) String() string {
	scheme := e.scheme
	if scheme == "" {
		scheme = "https"
	}
	return scheme + "://" + e.host + e.path
}

// hostsFile is containerd's <config dir>/<host>/hosts.toml (docs/hosts.md).
type hostsFile struct {
	Server       string               `toml:"server"`
	Capabilities []string             `toml:"capabilities"`
	SkipVerify   bool                 `toml:"skip_verify"`
	CA           any                  `toml:"ca"`
	Client       any                  `toml:"client"`
	Header       map[string]any       `toml:"header"`
	OverridePath bool                 `toml:"override_path"`
	DialTimeout  duration             `toml:"dial_timeout"`
	Host         map[string]hostEntry `toml:"host"`
}

type hostEntry struct {
	Capabilities []string       `toml:"capabilities"`
	SkipVerify   bool           `toml:"skip_verify"`
	CA           any            `toml:"ca"`
	Client       any            `toml:"client"`
	Header       map[string]any `toml:"header"`
	OverridePath bool           `toml:"override_path"`
	DialTimeout  duration       `toml:"dial_timeout"`
}

// duration reads TOML strings like "1s".
type duration struct{ time.Duration }

func (d *duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	d.Duration = v
	return err
}

// defaultServer is where a registry host's API lives without configuration.
func defaultServer(domain string) string {
	if domain == dockerHub {
		return "https://registry-1.docker.io"
	}
	return "https://" + domain
}

// endpoints lists where to pull domain's images from, in order: the
// [host."…"] entries of <dir>/<domain>/hosts.toml (or <dir>/_default/), then
// the upstream server. Without a file, only the upstream.
func endpoints(dir, domain string) ([]endpoint, error) {
	var path string
	if dir != "" {
		// containerd's order: "host_port_", "host:port", then "_default".
		cands := []string{domain, "_default"}
		if strings.Contains(domain, ":") {
			cands = append([]string{strings.ReplaceAll(domain, ":", "_") + "_"}, cands...)
		}
		for _, cand := range cands {
			p := filepath.Join(dir, cand, "hosts.toml")
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		// Docker's pattern: CA files (*.crt) in <dir>/<host>/ without hosts.toml.
		var cas []string
		if dir != "" {
			cas, _ = filepath.Glob(filepath.Join(dir, domain, "*.crt"))
		}
		up, err := newEndpoint(defaultServer(domain), nil, false, cas, nil, false)
		if err != nil {
			return nil, err
		}
		up.upstream = true
		// Unconfigured: HTTPS, except that loopback and private addresses
		// may fall back to plain HTTP (go-containerregistry's rule).
		up.scheme = ""
		return []endpoint{up}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read registry config %s: %w", path, err)
	}
	var hf hostsFile
	md, err := toml.Decode(string(data), &hf)
	if err != nil {
		return nil, fmt.Errorf("parse registry config %s: %w", path, err)
	}
	baseDir := filepath.Dir(path)
	var eps []endpoint
	seen := map[string]bool{}
	// Map order is random; the file's key order is the try order.
	for _, key := range md.Keys() {
		if len(key) != 2 || key[0] != "host" || seen[key[1]] {
			continue
		}
		seen[key[1]] = true
		h := hf.Host[key[1]]
		ep, err := newEndpoint(key[1], h.Capabilities, h.SkipVerify, caList(h.CA, baseDir), h.Header, h.OverridePath)
		if err != nil {
			return nil, fmt.Errorf("registry config %s: host %q: %w", path, key[1], err)
		}
		if ep.clientCerts, err = clientList(h.Client, baseDir); err != nil {
			return nil, fmt.Errorf("registry config %s: host %q: %w", path, key[1], err)
		}
		ep.dialTimeout = h.DialTimeout.Duration
		ep.ns = domain
		eps = append(eps, ep)
	}
	server := hf.Server
	if server == "" {
		server = defaultServer(domain)
	}
	up, err := newEndpoint(server, hf.Capabilities, hf.SkipVerify, caList(hf.CA, baseDir), hf.Header, hf.OverridePath)
	if err != nil {
		return nil, fmt.Errorf("registry config %s: server %q: %w", path, server, err)
	}
	if up.clientCerts, err = clientList(hf.Client, baseDir); err != nil {
		return nil, fmt.Errorf("registry config %s: %w", path, err)
	}
	up.dialTimeout = hf.DialTimeout.Duration
	if up.host == dockerHub {
		up.host = "registry-1.docker.io" // server = "https://docker.io" means the Hub API host
	}
	up.upstream = true
	return append(eps, up), nil
}

func newEndpoint(raw string, caps []string, skipVerify bool, ca []string, header map[string]any, overridePath bool) (endpoint, error) {
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return endpoint{}, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return endpoint{}, fmt.Errorf("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return endpoint{}, fmt.Errorf("no host")
	}
	p := strings.TrimSuffix(u.Path, "/")
	if !overridePath && !strings.HasSuffix(p, "/v2") {
		p += "/v2"
	}
	ep := endpoint{scheme: u.Scheme, host: u.Host, path: p, skipVerify: skipVerify, caFiles: ca, header: http.Header{}}
	if caps == nil {
		caps = []string{"pull", "resolve", "push"}
	}
	for _, c := range caps {
		switch c {
		case "pull":
			ep.pull = true
		case "resolve":
			ep.resolve = true
		}
	}
	for k, v := range header {
		switch v := v.(type) {
		case string:
			ep.header.Add(k, v)
		case []any:
			for _, s := range v {
				ep.header.Add(k, fmt.Sprint(s))
			}
		}
	}
	return ep, nil
}

// caList accepts ca = "file" or ca = ["a", "b"]; relative paths are relative
// to the hosts.toml directory.
func caList(v any, base string) []string {
	var out []string
	add := func(s string) {
		if !filepath.IsAbs(s) {
			s = filepath.Join(base, s)
		}
		out = append(out, s)
	}
	switch v := v.(type) {
	case string:
		add(v)
	case []any:
		for _, s := range v {
			if s, ok := s.(string); ok {
				add(s)
			}
		}
	}
	return out
}

// clientList accepts client = "pem", ["a", "b"] or [["cert", "key"], …].
func clientList(v any, base string) ([][2]string, error) {
	abs := func(s string) string {
		if s != "" && !filepath.IsAbs(s) {
			return filepath.Join(base, s)
		}
		return s
	}
	var out [][2]string
	add := func(x any) error {
		switch x := x.(type) {
		case string:
			out = append(out, [2]string{abs(x), ""})
		case []any:
			if len(x) != 2 {
				return fmt.Errorf("client: want [cert, key], got %v", x)
			}
			c, _ := x[0].(string)
			k, _ := x[1].(string)
			out = append(out, [2]string{abs(c), abs(k)})
		default:
			return fmt.Errorf("client: unexpected %v", x)
		}
		return nil
	}
	switch v := v.(type) {
	case nil:
	case string:
		return out, add(v)
	case []any:
		for _, x := range v {
			if err := add(x); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("client: unexpected %v", v)
	}
	return out, nil
}

// transport sends the registry API requests for this endpoint: TLS as
// configured, the endpoint's scheme and path prefix, extra headers.
func (e endpoint) transport() (http.RoundTripper, error) {
	base := remote.DefaultTransport.(*http.Transport).Clone()
	tlsCfg := &tls.Config{InsecureSkipVerify: e.skipVerify} //nolint:gosec // skip_verify is the user's explicit choice
	if len(e.caFiles) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		for _, f := range e.caFiles {
			pem, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("read CA %s: %w", f, err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("CA %s: no certificates", f)
			}
		}
		tlsCfg.RootCAs = pool
	}
	for _, pair := range e.clientCerts {
		key := pair[1]
		if key == "" {
			key = pair[0]
		}
		cert, err := tls.LoadX509KeyPair(pair[0], key)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s: %w", pair[0], err)
		}
		tlsCfg.Certificates = append(tlsCfg.Certificates, cert)
	}
	base.TLSClientConfig = tlsCfg
	if e.dialTimeout > 0 {
		base.DialContext = (&net.Dialer{Timeout: e.dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	}
	return &endpointTransport{ep: e, base: base}, nil
}

type endpointTransport struct {
	ep   endpoint
	base http.RoundTripper
}

func (t *endpointTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// Token servers live elsewhere: only the registry's own requests move.
	if req.URL.Host != t.ep.host {
		return t.base.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	if t.ep.scheme != "" {
		req.URL.Scheme = t.ep.scheme
	}
	if rest, ok := strings.CutPrefix(req.URL.Path, "/v2"); ok && t.ep.path != "/v2" {
		req.URL.Path = t.ep.path + rest
		req.URL.RawPath = ""
	}
	if t.ep.ns != "" {
		q := req.URL.Query()
		q.Set("ns", t.ep.ns)
		req.URL.RawQuery = q.Encode()
	}
	for k, v := range t.ep.header {
		req.Header[k] = v
	}
	return t.base.RoundTrip(req)
}
