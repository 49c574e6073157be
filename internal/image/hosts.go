package image

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// endpoint is one place to pull a registry's images from: a mirror from
// hosts.toml or the upstream server.
type endpoint struct {
	scheme     string // http or https, as configured (https without configuration)
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
	// credentialDomain is the registry whose pull credentials this mirror
	// may receive (hosts.toml credential_domain, canonicalRegistry form);
	// "" for none, the default.
	credentialDomain string
	// httpFallback: no configuration chose the scheme and the host is
	// loopback, so plain HTTP may be used (plainHTTP).
	httpFallback bool
}

// plainHTTP tells whether requests to e may go over plain HTTP: when its
// configuration says http:// (server or [host."http://…"]), or when
// nothing configures the host and it is loopback (localhost,
// 127.0.0.0/8, ::1), as containerd allows. Never for other hosts without
// configuration: go-containerregistry's own rule would also take RFC 1918
// addresses and *.localhost names over HTTP, where anyone on the path reads
// the pull's credentials and changes what is pulled.
func (e endpoint) plainHTTP() bool {
	return e.scheme == "http" || e.httpFallback
}

// isLoopbackHost: localhost, 127.0.0.0/8 or ::1, with or without a port.
func isLoopbackHost(hostport string) bool {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func (e endpoint) String() string {
	scheme := e.scheme
	if e.plainHTTP() {
		scheme = "http"
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
	// CredentialDomain opts this mirror in to the pull credentials of
	// that registry (containerd#10540's proposal): "docker.io",
	// "registry.example.com:5000". Absent, the mirror pulls anonymously.
	CredentialDomain string `toml:"credential_domain"`
}

// maxHostsFileSize bounds a hosts.toml: a configuration file is input
// too, and a few KiB is a large one.
const maxHostsFileSize = 1 << 20

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
		return "https://" + dockerHubAPI
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
		// Unconfigured: HTTPS; plain HTTP only for a loopback host (as
		// containerd), never for private addresses or *.localhost.
		up.httpFallback = isLoopbackHost(up.host)
		return []endpoint{up}, nil
	}
	data, err := readHostsFile(path)
	if err != nil {
		return nil, err
	}
	return parseHostsFile(data, path, domain)
}

// readHostsFile reads a hosts.toml of at most maxHostsFileSize bytes. It
// must be a regular file: a FIFO would block the pull, /dev/zero never
// end (opened without blocking, checked once open).
func readHostsFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read registry config %s: %w", path, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("registry config %s: not a regular file: refused", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxHostsFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read registry config %s: %w", path, err)
	}
	if len(data) > maxHostsFileSize {
		return nil, fmt.Errorf("registry config %s: larger than %d bytes: refused", path, maxHostsFileSize)
	}
	return data, nil
}

// parseHostsFile reads the endpoints of domain from the hosts.toml at path
// whose content is data.
func parseHostsFile(data []byte, path, domain string) ([]endpoint, error) {
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
		if h.CredentialDomain != "" {
			if ep.credentialDomain, err = ServerAddressHost(h.CredentialDomain); err != nil {
				return nil, fmt.Errorf("registry config %s: host %q: credential_domain: %w", path, key[1], err)
			}
		}
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
		up.host = dockerHubAPI // server = "https://docker.io" means the Hub API host
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
		// A credential never crosses the network in clear text on behalf
		// of a registry reached over TLS: a challenge's realm (or a
		// redirect from it) naming http:// would hand the pull secret to
		// anyone on the path (CVE-2019-10214). go-containerregistry
		// refuses such a realm too; this holds whatever it does. An
		// OAuth2 token request is a POST carrying the password or
		// refresh token in its body.
		if req.URL.Scheme == "http" && !t.ep.plainHTTP() && (req.Header.Get("Authorization") != "" || req.Method == http.MethodPost) {
			return nil, fmt.Errorf("refusing to send credentials in clear text to %s for the TLS registry %s", req.URL.Host, t.ep.host)
		}
		return t.base.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	if !t.ep.httpFallback {
		// The configured scheme, whatever go-containerregistry chose.
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
