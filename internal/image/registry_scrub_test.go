package image

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestScrubText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`Get "http://h:1/v2/a/blobs/sha256:ab?token=SECRET&X-Amz-Signature=SIG": dial tcp h:1: refused`,
			`Get "http://h:1/v2/a/blobs/sha256:ab?X-Amz-Signature=REDACTED&token=REDACTED": dial tcp h:1: refused`},
		{`GET https://h/token?scope=repository%3Aa%3Apull&service=reg: 401`, `GET https://h/token?scope=repository%3Aa%3Apull&service=reg: 401`},
		{`GET https://alice:s3cret@h/v2/: 401`, `GET https://h/v2/: 401`},
		{`denied for Basic YWxpY2U6czNjcmV0 and Bearer eyJhbGciOi.x.y`, `denied for Basic REDACTED and Bearer REDACTED`},
		{`this registry requires basic authentication`, `this registry requires basic authentication`},
		{`no URL, no secret`, `no URL, no secret`},
	} {
		if got := scrubText(tc.in); got != tc.want {
			t.Errorf("scrubText(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestAuthSecretsCoverEveryForm(t *testing.T) {
	a := &Auth{Username: "alice", Password: "s3cret", IdentityToken: "idtok-123", RegistryToken: "regtok-456"}
	b64 := base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	viaAuth := &Auth{Auth: b64}
	for _, tc := range []struct {
		a    *Auth
		text string
	}{
		{a, "echo: s3cret, Basic " + b64 + ", idtok-123, regtok-456"},
		{viaAuth, "echo: alice:s3cret and " + b64},
	} {
		got := scrubSecrets(tc.text, tc.a.secrets())
		for _, s := range []string{"s3cret", b64, "idtok-123", "regtok-456"} {
			if strings.Contains(got, s) {
				t.Errorf("scrubSecrets left %q in %q", s, got)
			}
		}
	}
	if got := (*Auth)(nil).secrets(); got != nil {
		t.Errorf("nil auth has secrets %q", got)
	}
}

func TestRequestSecrets(t *testing.T) {
	req, _ := http.NewRequest(http.MethodGet, "https://s/b?service=reg&scope=x&sig=SIGVALUE", nil)
	req.SetBasicAuth("alice", "s3cret")
	got := scrubSecrets("Authorization "+req.Header.Get("Authorization")+" alice:s3cret sig SIGVALUE service reg scope", requestSecrets(req))
	if strings.Contains(got, "s3cret") || strings.Contains(got, "SIGVALUE") || !strings.Contains(got, "service reg scope") {
		t.Errorf("scrubbed %q", got)
	}
}

func TestClassifyKeepsKindAndScrubs(t *testing.T) {
	u, _ := url.Parse("https://s/b?token=TOKVALUE")
	terr := &transport.Error{StatusCode: http.StatusForbidden, Request: &http.Request{Method: http.MethodGet, URL: u}}
	err := classify(fmt.Errorf("read config: %w", &url.Error{Op: "Get", URL: u.String(), Err: terr}))
	if !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("kind lost: %v", err)
	}
	if strings.Contains(err.Error(), "TOKVALUE") {
		t.Errorf("token in %q", err)
	}
	if again := classify(err); strings.Count(again.Error(), "unauthenticated") != 1 {
		t.Errorf("classify twice: %q", again)
	}
}
