package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"

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
}

func (a *Auth) authenticator() authn.Authenticator {
	if a == nil || *a == (Auth{}) {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{
		Username: a.Username, Password: a.Password, Auth: a.Auth,
		IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken,
	})
}

func (a *Auth) key() string {
	if a == nil {
		return ""
	}
	h := sha256.Sum256([]byte(a.Username + "\x00" + a.Password + "\x00" + a.Auth + "\x00" + a.IdentityToken + "\x00" + a.RegistryToken))
	return hex.EncodeToString(h[:8])
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
	var regOpts []name.Option
	if ep.scheme == "http" {
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
	authed, err := transport.NewWithContext(ctx, reg, auth.authenticator(), inner, []string{repo.Scope(transport.PullScope)})
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
		blobURL: fmt.Sprintf("%s://%s/v2/%s/blobs/", reg.Scheme(), reg.RegistryStr(), repo.RepositoryStr()),
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

// classify maps registry errors to error kinds.
func classify(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %w", errdefs.ErrUnauthenticated, err)
		case http.StatusNotFound:
			return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
	}
	return err
}
