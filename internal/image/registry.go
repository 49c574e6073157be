package image

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/berthcri/berth/internal/errdefs"
)

// Talking to a registry: credentials, one repository on one endpoint, and
// the classification of registry errors.

// Auth is registry credentials, as the CRI AuthConfig carries them.
type Auth struct {
	Username      string
	Password      string
	Auth          string // base64 "user:password"
	IdentityToken string
	RegistryToken string
	// ServerAddress is the registry the credentials belong to (the CRI's
	// server_address; the kubelet sets it from the keyring entry that
	// matched the image): "host[:port]", with or without a scheme and a
	// path ("https://index.docker.io/v1/"). "" means the image's own
	// registry. The credentials go only to that host (forEndpoint).
	ServerAddress string
}

func (a *Auth) authenticator() authn.Authenticator {
	if a == nil || a.secretless() {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{
		Username: a.Username, Password: a.Password, Auth: a.Auth,
		IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken,
	})
}

// secretless is an Auth that carries nothing to send.
func (a *Auth) secretless() bool {
	return a.Username == "" && a.Password == "" && a.Auth == "" && a.IdentityToken == "" && a.RegistryToken == ""
}

func (a *Auth) key() string {
	if a == nil {
		return ""
	}
	h := sha256.Sum256([]byte(a.Username + "\x00" + a.Password + "\x00" + a.Auth + "\x00" + a.IdentityToken + "\x00" + a.RegistryToken + "\x00" + a.ServerAddress))
	return hex.EncodeToString(h[:8])
}

// ServerAddressHost is the registry host a CRI server_address names, in
// the form endpoints compare (canonicalRegistry). It accepts what the
// kubelet's keyring and crictl give: "host[:port]", "https://host/v1/".
// Anything else, user information in a URL included, is refused: a
// credential whose destination cannot be told is sent nowhere.
func ServerAddressHost(addr string) (string, error) {
	raw := strings.TrimSpace(addr)
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || (u.Scheme != "http" && u.Scheme != "https") {
		// The value is not echoed: it may hold a secret (user:password@).
		return "", fmt.Errorf("server_address is not a registry host ([scheme://]host[:port][/path]): %w", errdefs.ErrInvalidArgument)
	}
	if !domainPattern.MatchString(u.Host) {
		return "", fmt.Errorf("server_address host %q is not a registry host: %w", u.Host, errdefs.ErrInvalidArgument)
	}
	return canonicalRegistry(u.Host), nil
}

// canonicalRegistry is host as credentials are matched: lower case, and
// Docker Hub's spellings as one (docker.io, index.docker.io — the
// keyring's "https://index.docker.io/v1/" — and the API host
// registry-1.docker.io), as containerd and the kubelet treat them.
func canonicalRegistry(host string) string {
	h := strings.ToLower(host)
	switch h {
	case dockerHub, dockerHubLegacy, dockerHubAPI:
		return dockerHub
	}
	return h
}

// forEndpoint is what of a a pull of an image on registry domain may send
// to ep: a itself, or nil (anonymous). The credentials belong to one
// registry (ServerAddress, else domain) and go to:
//   - ep when its host is that registry (containerd's ParseAuth rule);
//   - the upstream endpoint of domain when they are domain's (its
//     hosts.toml `server` is where the operator says domain lives);
//   - a mirror only when its hosts.toml entry names that registry in
//     credential_domain (containerd#10540): a mirror is another party,
//     and the kubelet's pull secret is not its to see unless the operator
//     says it is.
//
// A ServerAddress that does not parse sends nothing (the CRI layer
// refuses it before).
func (a *Auth) forEndpoint(ep endpoint, domain string) *Auth {
	if a == nil || a.secretless() {
		return nil
	}
	owner := canonicalRegistry(domain)
	if a.ServerAddress != "" {
		var err error
		if owner, err = ServerAddressHost(a.ServerAddress); err != nil {
			return nil
		}
	}
	switch {
	case canonicalRegistry(ep.host) == owner:
		return a
	case owner != canonicalRegistry(domain):
		return nil
	case ep.upstream, ep.credentialDomain == owner:
		return a
	}
	return nil
}

// repoClient reaches one repository on one endpoint: the reference and
// options for go-containerregistry (manifests, configs) and an HTTP client
// with the endpoint's TLS, headers and registry auth for layer blobs, which
// berth streams itself.
type repoClient struct {
	repo    name.Repository
	ref     name.Reference
	opts    []remote.Option
	http    *http.Client
	blobURL string // scheme://host/v2/<repo>/blobs/
}

// remoteRef is n's repository at endpoint ep. It talks to the registry
// once (the API ping that finds the auth scheme).
func remoteRef(ctx context.Context, ep endpoint, n Named, auth *Auth) (*repoClient, error) {
	tr, err := ep.transport()
	if err != nil {
		return nil, err
	}
	// Innermost, so that it sees each request as sent (its Authorization,
	// the redirect's URL) and each error body before anything quotes it.
	tr = &scrubTransport{base: tr, secrets: auth.secrets()}
	// Plain HTTP only where the endpoint allows it (plainHTTP, hosts.go):
	// go-containerregistry's own rule would also use it for RFC 1918
	// addresses and *.localhost names.
	scheme := "https"
	var regOpts []name.Option
	if ep.plainHTTP() {
		scheme = "http"
		regOpts = append(regOpts, name.Insecure)
	}
	reg, err := name.NewRegistry(ep.host, regOpts...)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", ep.host, errdefs.ErrInvalidArgument)
	}
	repo := reg.Repo(n.Path)
	var gref name.Reference = repo.Tag(n.Tag)
	if n.Digest != "" {
		gref = repo.Digest(n.Digest)
	}
	// Wrapped once here (retries, user agent, auth) so that manifest and
	// blob requests share one token.
	inner := transport.NewUserAgent(transport.NewRetry(tr), "berth")
	// Credentials only where they belong (forEndpoint); a redirect to
	// another host (blob storage) never gets them: go-containerregistry's
	// transports add Authorization only for the registry's own host.
	authed, err := transport.NewWithContext(ctx, reg, auth.forEndpoint(ep, n.Domain).authenticator(), inner, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, classify(err)
	}
	return &repoClient{
		repo: repo,
		ref:  gref,
		opts: []remote.Option{
			remote.WithContext(ctx),
			remote.WithTransport(authed),
			remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		},
		http:    &http.Client{Transport: authed},
		blobURL: fmt.Sprintf("%s://%s/v2/%s/blobs/", scheme, reg.RegistryStr(), repo.RepositoryStr()),
	}, nil
}

// openBlob starts the download of a blob; the body is read as it arrives
// and checked by the caller. ctx bounds the whole download.
func (c *repoClient) openBlob(ctx context.Context, digest string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.blobURL+digest, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		resp.Body.Close()
		return nil, classify(err)
	}
	return resp.Body, nil
}

// openBlobRange asks for the bytes [start, end) of a blob. partial is
// true for a 206 whose Content-Range is that range; a 200 (a registry or
// proxy that ignores Range) is the whole blob, partial false. Any other
// answer, a 206 for other bytes included, is an error.
func (c *repoClient) openBlobRange(ctx context.Context, digest string, start, end int64) (io.ReadCloser, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.blobURL+digest, nil)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end-1))
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp.Body, false, nil
	}
	if err := transport.CheckError(resp, http.StatusPartialContent); err != nil {
		resp.Body.Close()
		return nil, false, classify(err)
	}
	var first, last int64
	cr := resp.Header.Get("Content-Range")
	if _, err := fmt.Sscanf(cr, "bytes %d-%d/", &first, &last); err != nil || first != start || last != end-1 {
		resp.Body.Close()
		return nil, false, fmt.Errorf("blob %s: asked for bytes %d-%d, the registry answered Content-Range %q", digest, start, end-1, cr)
	}
	return resp.Body, true, nil
}

// registryBlobs opens a pull's layer blobs on one repository, whole or
// in ranges (rangeOpener).
type registryBlobs struct {
	c   *repoClient
	set RangeFetch
	// lazy serves eStargz layers lazily (decision 3600), each range
	// request bounded by lazyTimeout.
	lazy        bool
	lazyTimeout time.Duration
	// lazyQuiet delays each lazy layer's background fetch until reads
	// have stopped this long (lazyquiet.go).
	lazyQuiet time.Duration
}

func (b registryBlobs) open(ctx context.Context, lr layerMeta) (io.ReadCloser, error) {
	return b.c.openBlob(ctx, lr.Digest)
}

func (b registryBlobs) openRange(ctx context.Context, lr layerMeta, start, end int64) (io.ReadCloser, bool, error) {
	return b.c.openBlobRange(ctx, lr.Digest, start, end)
}

func (b registryBlobs) ranges() RangeFetch { return b.set }

// classify maps registry errors to error kinds, with any credential in
// the text scrubbed (scrubError): the message goes to the kubelet, which
// puts it in the pod's events, and to berthd's log.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var terr *transport.Error
	if errors.As(err, &terr) && !errors.Is(err, errdefs.ErrUnauthenticated) && !errors.Is(err, errdefs.ErrNotFound) {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			err = fmt.Errorf("%w: %w", errdefs.ErrUnauthenticated, err)
		case http.StatusNotFound:
			err = fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
	}
	return scrubError(err)
}

// Credentials in registry errors (containerd 1.7.31, #12805: registry
// errors returned over gRPC leaked credentials into pod events). A
// registry's error body is its own text: a hostile or careless one
// echoes the request's Authorization, and a redirect's URL (a pre-signed
// storage URL) carries a token in its query. Two layers keep them out:
// scrubTransport replaces the secrets it knows in every error body as it
// arrives, and scrubError rewrites what any error text says of URLs and
// Authorization values.

// maxErrorBody bounds what of a registry's error response is read: the
// body becomes an error message, and a few KiB is a long one.
const maxErrorBody = 64 << 10

// minSecretLen: shorter strings are not scrubbed from error bodies, where
// replacing every "ab" would leave nothing to read. Real credentials are
// longer.
const minSecretLen = 4

// redacted replaces a secret.
const redacted = "REDACTED"

// secrets are a's credentials in each form a registry could echo: as
// given, base64 "user:password" (the Basic header) and its decoding.
func (a *Auth) secrets() []string {
	if a == nil || a.secretless() {
		return nil
	}
	out := []string{a.Password, a.Auth, a.IdentityToken, a.RegistryToken}
	if a.Username != "" || a.Password != "" {
		out = append(out, base64.StdEncoding.EncodeToString([]byte(a.Username+":"+a.Password)))
	}
	if raw, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
		out = append(out, string(raw))
		if _, pw, ok := strings.Cut(string(raw), ":"); ok {
			out = append(out, pw)
		}
	}
	return out
}

// requestSecrets are what req itself carries that must not come back in
// an error: its Authorization credential (and a Basic one decoded), and
// the values of its query parameters that are not the registry
// protocol's own.
func requestSecrets(req *http.Request) []string {
	var out []string
	if h := req.Header.Get("Authorization"); h != "" {
		scheme, cred, ok := strings.Cut(h, " ")
		if !ok {
			cred = scheme
		}
		out = append(out, h, cred)
		if strings.EqualFold(scheme, "basic") {
			if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
				out = append(out, string(raw))
				if _, pw, ok := strings.Cut(string(raw), ":"); ok {
					out = append(out, pw)
				}
			}
		}
	}
	for k, vs := range req.URL.Query() {
		if !publicQueryParam[k] {
			out = append(out, vs...)
		}
	}
	return out
}

// publicQueryParam are the registry API's query parameters, which say
// nothing secret (go-containerregistry's redaction allowlist, and the
// ns= of a mirror). Any other value may be a token.
var publicQueryParam = map[string]bool{"scope": true, "service": true, "mount": true, "from": true, "digest": true, "n": true, "last": true, "ns": true}

// scrubSecrets replaces each secret (longest first, so that a secret
// holding another goes whole) in s.
func scrubSecrets(s string, secrets []string) string {
	secrets = slices.Clone(secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, sec := range secrets {
		if len(sec) >= minSecretLen {
			s = strings.ReplaceAll(s, sec, redacted)
		}
	}
	return s
}

// scrubTransport reads each error response's body (at most maxErrorBody
// bytes) and hands it on with the secrets it knows and the request's own
// replaced.
type scrubTransport struct {
	base    http.RoundTripper
	secrets []string
}

func (t *scrubTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode < http.StatusBadRequest {
		return resp, err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	clean := scrubSecrets(string(body), append(requestSecrets(req), t.secrets...))
	resp.Body = io.NopCloser(strings.NewReader(clean))
	resp.ContentLength = int64(len(clean))
	resp.Header.Del("Content-Length")
	return resp, nil
}

var (
	// urlInText is a URL in an error's text (url.Error quotes it).
	urlInText = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+`)
	// authInText is an Authorization value in an error's text.
	authInText = regexp.MustCompile(`(?i)\b(?:basic|bearer)\s+[A-Za-z0-9._~+/=-]{8,}`)
)

// scrubText removes what any text may say of credentials: the user
// information and the non-protocol query values of the URLs in it, and
// Basic or Bearer credentials.
func scrubText(s string) string {
	s = urlInText.ReplaceAllStringFunc(s, func(match string) string {
		// The punctuation that follows a URL in prose ("GET <url>: …").
		raw := strings.TrimRight(match, ":;,.)]")
		tail := match[len(raw):]
		u, err := url.Parse(raw)
		if err != nil {
			return match
		}
		changed := false
		if u.User != nil {
			u.User, changed = nil, true
		}
		if u.RawQuery != "" {
			q := u.Query()
			for k, vs := range q {
				if publicQueryParam[k] {
					continue
				}
				for i := range vs {
					vs[i], changed = redacted, true
				}
			}
			u.RawQuery = q.Encode()
		}
		if !changed {
			return match
		}
		return u.String() + tail
	})
	return authInText.ReplaceAllStringFunc(s, func(m string) string {
		i := strings.LastIndexFunc(m, unicode.IsSpace)
		if cred := m[i+1:]; strings.ToLower(cred) == cred && !strings.ContainsAny(cred, "0123456789+/=._~-") {
			return m // a word ("basic authentication"), not a credential
		}
		return m[:i+1] + redacted
	})
}

// scrubbedError is an error whose text had credentials scrubbed; it
// unwraps to the original, so its kind (errdefs, transport.Error) holds.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrubError is err with scrubText applied to its text.
func scrubError(err error) error {
	msg := err.Error()
	if clean := scrubText(msg); clean != msg {
		return &scrubbedError{msg: clean, err: err}
	}
	return err
}
