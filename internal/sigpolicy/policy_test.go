package sigpolicy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func mustParse(t *testing.T, js string) *Policy {
	t.Helper()
	p, err := Parse([]byte(js), t.TempDir())
	if err != nil {
		t.Fatalf("parse %s: %v", js, err)
	}
	return p
}

func ref(t *testing.T, s string) image.Named {
	t.Helper()
	n, err := image.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func keyData(k *testimages.CosignKey) string {
	return base64.StdEncoding.EncodeToString(k.PublicPEM)
}

func TestLoadAbsentFileIsNoPolicy(t *testing.T) {
	for _, path := range []string{"", filepath.Join(t.TempDir(), "policy.json")} {
		p, err := Load(path)
		if err != nil || p != nil {
			t.Errorf("Load(%q) = %v, %v; want no policy", path, p, err)
		}
	}
}

func TestParseRefusesWhatItCannotEnforce(t *testing.T) {
	dir := t.TempDir()
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(p384.Public())
	if err != nil {
		t.Fatal(err)
	}
	p384PEM := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	good := keyData(testimages.NewCosignKey(t, "ecdsa"))
	for js, want := range map[string]string{
		`{}`:                              `"default" is required`,
		`{"default": []}`:                 "must not be empty",
		`{"default": [{"type": "nope"}]}`: `unknown requirement type "nope"`,
		`{"default": [{"type": "reject", "x": 1}]}`:                                                                                                        "unknown field",
		`{"default": [{"type": "reject"}], "extra": 1}`:                                                                                                    "unknown field",
		`{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/k"}]}`:                                                                       "GPG simple signing) is not supported",
		`{"default": [{"type": "sigstoreSigned"}]}`:                                                                                                        "exactly one of keyPath",
		`{"default": [{"type": "sigstoreSigned", "keyPath": "/nonexistent.pub"}]}`:                                                                         "read key",
		`{"default": [{"type": "sigstoreSigned", "keyData": "` + good + `", "keyPath": "/k"}]}`:                                                            "exactly one of keyPath",
		`{"default": [{"type": "sigstoreSigned", "keyData": "` + good + `", "fulcio": {}}]}`:                                                               "fulcio and pki",
		`{"default": [{"type": "sigstoreSigned", "keyData": "` + good + `", "rekorPublicKeyPath": "/r"}]}`:                                                 "rekorPublicKey",
		`{"default": [{"type": "sigstoreSigned", "keyData": "` + p384PEM + `"}]}`:                                                                          "only P-256",
		`{"default": [{"type": "sigstoreSigned", "keyData": "bm90IGEga2V5"}]}`:                                                                             "keyData[0]",
		`{"default": [{"type": "sigstoreSigned", "keyData": "` + good + `", "signedIdentity": {"type": "matchRepository", "prefix": "x"}}]}`:               "takes no other field",
		`{"default": [{"type": "sigstoreSigned", "keyData": "` + good + `", "signedIdentity": {"type": "exactReference", "dockerReference": "busybox"}}]}`: "full repo:tag",
		`{"default": [{"type": "reject"}], "transports": {"docker": {"busybox:latest": [{"type": "reject"}]}}}`:                                            "fully expanded",
		`{"default": [{"type": "reject"}], "transports": {"docker": {"ex*mple.com": [{"type": "reject"}]}}}`:                                               "wildcard",
		`{"default": [{"type": "reject"}], "transports": {"docker": {"docker.io/busybox": [{"type": "reject"}]}}}`:                                         "fully expanded",
	} {
		_, err := Parse([]byte(js), dir)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v, want an error with %q", js, err, want)
		}
	}
}

func TestParseKeepsOtherTransportsAndReadsKeyFiles(t *testing.T) {
	dir := t.TempDir()
	k := testimages.NewCosignKey(t, "ed25519")
	if err := os.WriteFile(filepath.Join(dir, "cosign.pub"), k.PublicPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	// Fedora's default policy.json has docker-daemon; a relative keyPath
	// is the policy file's directory's.
	js := `{"default": [{"type": "insecureAcceptAnything"}],
	  "transports": {
	    "docker-daemon": {"": [{"type": "insecureAcceptAnything"}]},
	    "docker": {"example.com/app": [{"type": "sigstoreSigned", "keyPaths": ["cosign.pub"]}]}}}`
	path := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := p.Match(ref(t, "example.com/app:v1"))
	if sc.Name != `docker "example.com/app"` || len(sc.Requirements) != 1 || len(sc.Requirements[0].Keys) != 1 {
		t.Fatalf("scope %+v", sc)
	}
	if sc.Requirements[0].Keys[0].Name != filepath.Join(dir, "cosign.pub") {
		t.Errorf("key name %q", sc.Requirements[0].Keys[0].Name)
	}
	if sc.Requirements[0].Identity.Type != identityMatchRepoDigestOrExact {
		t.Errorf("default signedIdentity %q", sc.Requirements[0].Identity.Type)
	}
	if !strings.HasPrefix(p.Digest, "sha256:") || p.Path != path {
		t.Errorf("digest %q path %q", p.Digest, p.Path)
	}
}

func TestMatchMostSpecificScopeWins(t *testing.T) {
	p := mustParse(t, `{"default": [{"type": "reject"}], "transports": {"docker": {
	  "": [{"type": "insecureAcceptAnything"}],
	  "reg.example.com:5000": [{"type": "reject"}],
	  "reg.example.com:5000/team": [{"type": "insecureAcceptAnything"}],
	  "reg.example.com:5000/team/app": [{"type": "reject"}],
	  "reg.example.com:5000/team/app:v1": [{"type": "insecureAcceptAnything"}],
	  "reg.example.com:5000/team/app@`+digestA+`": [{"type": "insecureAcceptAnything"}],
	  "*.example.com": [{"type": "reject"}],
	  "*.com": [{"type": "insecureAcceptAnything"}],
	  "docker.io/library/busybox": [{"type": "reject"}]
	}}}`)
	for in, want := range map[string]string{
		"reg.example.com:5000/team/app:v1":            `docker "reg.example.com:5000/team/app:v1"`,
		"reg.example.com:5000/team/app@" + digestA:    `docker "reg.example.com:5000/team/app@` + digestA + `"`,
		"reg.example.com:5000/team/app:v2":            `docker "reg.example.com:5000/team/app"`,
		"reg.example.com:5000/team/other:v1":          `docker "reg.example.com:5000/team"`,
		"reg.example.com:5000/team/sub/x:v1":          `docker "reg.example.com:5000/team"`,
		"reg.example.com:5000/solo:v1":                `docker "reg.example.com:5000"`,
		"other.example.com/x:v1":                      `docker "*.example.com"`,
		"a.b.example.com/x:v1":                        `docker "*.example.com"`,
		"example.com/x:v1":                            `docker "*.com"`,
		"busybox":                                     `docker "docker.io/library/busybox"`,
		"quay.io/x/y:1":                               `docker ""`,
		"reg.example.com:5000/team/app:v1@" + digestB: `docker "reg.example.com:5000/team/app:v1"`,
	} {
		if got := p.Match(ref(t, in)).Name; got != want {
			t.Errorf("Match(%s) = %s, want %s", in, got, want)
		}
	}
	// Without the transport default, the global default; an unnamed
	// image (an import) gets the defaults too.
	q := mustParse(t, `{"default": [{"type": "reject"}], "transports": {"docker": {"example.com": [{"type": "insecureAcceptAnything"}]}}}`)
	if got := q.Match(ref(t, "quay.io/x/y:1")).Name; got != "default" {
		t.Errorf("no transport default: %s", got)
	}
	if got := q.Match(image.Named{}).Name; got != "default" {
		t.Errorf("unnamed image: %s", got)
	}
}

// signed is one signature by k of a payload naming identity and digest.
func signed(t *testing.T, k *testimages.CosignKey, identity, digest string) image.CosignSignature {
	pl := testimages.CosignPayload(t, identity, digest)
	return image.CosignSignature{Payload: pl, Signature: k.Sign(t, pl), LayerDigest: digestB}
}

func check(p *Policy, r image.Named, digest string, sigs ...image.CosignSignature) error {
	return p.Check(context.Background(), image.SignatureCheck{
		Ref: r, Digest: digest, Source: "the test",
		Signatures: func(context.Context) ([]image.CosignSignature, error) { return sigs, nil },
	})
}

func wantRefused(t *testing.T, err error, scope, reason string) {
	t.Helper()
	se, ok := image.AsSignatureError(err)
	if !ok {
		t.Fatalf("got %v, want a refusal", err)
	}
	if se.Scope != scope || !strings.Contains(se.Reason, reason) {
		t.Fatalf("refusal %q (scope %s), want scope %s and a reason with %q", se.Message(), se.Scope, scope, reason)
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a refusal is not a FailedPrecondition")
	}
}

func TestCheckCosignSignatures(t *testing.T) {
	ec := testimages.NewCosignKey(t, "ecdsa")
	ed := testimages.NewCosignKey(t, "ed25519")
	other := testimages.NewCosignKey(t, "ecdsa")
	p := mustParse(t, fmt.Sprintf(`{"default": [{"type": "reject"}], "transports": {"docker": {
	  "example.com/app": [{"type": "sigstoreSigned", "keyDatas": [%q, %q], "signedIdentity": {"type": "matchRepository"}}],
	  "example.com/strict": [{"type": "sigstoreSigned", "keyData": %q}],
	  "example.com/open": [{"type": "insecureAcceptAnything"}]
	}}}`, keyData(ec), keyData(ed), keyData(ec)))
	app := ref(t, "example.com/app:v1")
	scope := `docker "example.com/app"`

	for name, k := range map[string]*testimages.CosignKey{"ecdsa": ec, "ed25519": ed} {
		if err := check(p, app, digestA, signed(t, k, "example.com/app", digestA)); err != nil {
			t.Errorf("%s signature refused: %v", name, err)
		}
	}
	// One good signature among bad ones is enough.
	if err := check(p, app, digestA, signed(t, other, "example.com/app", digestA), signed(t, ec, "example.com/app", digestA)); err != nil {
		t.Errorf("good signature after a bad one refused: %v", err)
	}
	wantRefused(t, check(p, app, digestA), scope, "no signature")
	wantRefused(t, check(p, app, digestA, signed(t, other, "example.com/app", digestA)), scope, "does not verify with the trusted key")
	wantRefused(t, check(p, app, digestA, signed(t, ec, "example.com/app", digestB)), scope, "digest mismatch")
	wantRefused(t, check(p, app, digestA, signed(t, ec, "example.com/elsewhere", digestA)), scope, "does not match example.com/app")

	tampered := signed(t, ec, "example.com/app", digestB)
	tampered.Payload = testimages.CosignPayload(t, "example.com/app", digestA)
	wantRefused(t, check(p, app, digestA, tampered), scope, "payload was changed after signing")
	unsignedLayer := signed(t, ec, "example.com/app", digestA)
	unsignedLayer.Signature = ""
	wantRefused(t, check(p, app, digestA, unsignedLayer), scope, "no dev.cosignproject.cosign/signature annotation")

	// The default signedIdentity (matchRepoDigestOrExact) wants repo:tag
	// for a pull by tag, which cosign's repository-only identity is not;
	// by digest the repository suffices.
	strictScope := `docker "example.com/strict"`
	wantRefused(t, check(p, ref(t, "example.com/strict:v1"), digestA, signed(t, ec, "example.com/strict", digestA)), strictScope, "matchRepoDigestOrExact")
	if err := check(p, ref(t, "example.com/strict:v1"), digestA, signed(t, ec, "example.com/strict:v1", digestA)); err != nil {
		t.Errorf("exact identity refused: %v", err)
	}
	if err := check(p, ref(t, "example.com/strict@"+digestA), digestA, signed(t, ec, "example.com/strict", digestA)); err != nil {
		t.Errorf("by digest, repository identity refused: %v", err)
	}

	if err := check(p, ref(t, "example.com/open:v1"), digestA); err != nil {
		t.Errorf("insecureAcceptAnything refused: %v", err)
	}
	wantRefused(t, check(p, ref(t, "quay.io/x:1"), digestA), "default", "rejects every image")
	wantRefused(t, p.Precheck(ref(t, "quay.io/x:1")), "default", "rejects every image")
	if err := p.Precheck(app); err != nil {
		t.Errorf("Precheck of a signed scope: %v", err)
	}
}

func TestCheckSignaturesAreFetchedOnlyWhenNeeded(t *testing.T) {
	p := mustParse(t, `{"default": [{"type": "insecureAcceptAnything"}]}`)
	err := p.Check(context.Background(), image.SignatureCheck{
		Ref: ref(t, "example.com/app:v1"), Digest: digestA,
		Signatures: func(context.Context) ([]image.CosignSignature, error) {
			t.Error("signatures fetched for insecureAcceptAnything")
			return nil, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestIdentityRemapAndExact(t *testing.T) {
	k := testimages.NewCosignKey(t, "ecdsa")
	p := mustParse(t, fmt.Sprintf(`{"default": [{"type": "reject"}], "transports": {"docker": {
	  "mirror.local:5000/vendor": [{"type": "sigstoreSigned", "keyData": %q,
	      "signedIdentity": {"type": "remapIdentity", "prefix": "mirror.local:5000/vendor", "signedPrefix": "vendor.example.com"}}],
	  "mirror.local:5000/pinned": [{"type": "sigstoreSigned", "keyData": %q,
	      "signedIdentity": {"type": "exactRepository", "dockerRepository": "upstream.example.com/pinned"}}]
	}}}`, keyData(k), keyData(k)))
	if err := check(p, ref(t, "mirror.local:5000/vendor/prod/img:1.0"), digestA, signed(t, k, "vendor.example.com/prod/img:1.0", digestA)); err != nil {
		t.Errorf("remapped identity refused: %v", err)
	}
	wantRefused(t, check(p, ref(t, "mirror.local:5000/vendor/prod/img:1.0"), digestA, signed(t, k, "vendor.example.com/prod/img:2.0", digestA)), `docker "mirror.local:5000/vendor"`, "remapIdentity")
	if err := check(p, ref(t, "mirror.local:5000/pinned:any"), digestA, signed(t, k, "upstream.example.com/pinned", digestA)); err != nil {
		t.Errorf("exactRepository refused: %v", err)
	}
}

// bundled is one DSSE signature by k of a sigstore bundle's statement.
func bundled(t *testing.T, k *testimages.CosignKey, statement []byte) image.CosignSignature {
	t.Helper()
	var b struct {
		DSSEEnvelope struct {
			Payload     string `json:"payload"`
			PayloadType string `json:"payloadType"`
			Signatures  []struct {
				Sig string `json:"sig"`
			} `json:"signatures"`
		} `json:"dsseEnvelope"`
	}
	if err := json.Unmarshal(k.Bundle(t, statement), &b); err != nil {
		t.Fatal(err)
	}
	payload, err := base64.StdEncoding.DecodeString(b.DSSEEnvelope.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return image.CosignSignature{Payload: payload, Signature: b.DSSEEnvelope.Signatures[0].Sig, LayerDigest: digestB, Bundle: true, PayloadType: b.DSSEEnvelope.PayloadType}
}

func TestCheckSigstoreBundles(t *testing.T) {
	k := testimages.NewCosignKey(t, "ecdsa")
	ed := testimages.NewCosignKey(t, "ed25519")
	other := testimages.NewCosignKey(t, "ecdsa")
	p := mustParse(t, fmt.Sprintf(`{"default": [{"type": "sigstoreSigned", "keyDatas": [%q, %q], "signedIdentity": {"type": "matchRepository"}}]}`, keyData(k), keyData(ed)))
	app := ref(t, "example.com/app:v1")
	for name, key := range map[string]*testimages.CosignKey{"ecdsa": k, "ed25519": ed} {
		if err := check(p, app, digestA, bundled(t, key, testimages.BundleStatement(t, "example.com/app", digestA))); err != nil {
			t.Errorf("%s bundle refused: %v", name, err)
		}
	}
	wantRefused(t, check(p, app, digestA, bundled(t, other, testimages.BundleStatement(t, "example.com/app", digestA))), "default", "does not verify")
	wantRefused(t, check(p, app, digestA, bundled(t, k, testimages.BundleStatement(t, "example.com/app", digestB))), "default", "digest mismatch")
	wantRefused(t, check(p, app, digestA, bundled(t, k, testimages.BundleStatement(t, "example.com/else", digestA))), "default", "does not match example.com/app")
	att := strings.Replace(string(testimages.BundleStatement(t, "example.com/app", digestA)), "https://sigstore.dev/cosign/sign/v1", "https://slsa.dev/provenance/v1", 1)
	wantRefused(t, check(p, app, digestA, bundled(t, k, []byte(att))), "default", "an attestation of type")
	// The statement changed after signing.
	s := bundled(t, k, testimages.BundleStatement(t, "example.com/app", digestB))
	s.Payload = testimages.BundleStatement(t, "example.com/app", digestA)
	wantRefused(t, check(p, app, digestA, s), "default", "payload was changed after signing")

	// cosign v3's own statement binds the digest alone: it claims no
	// identity, so no signedIdentity accepts it, whatever the name
	// (issue 34: signed for one repository, it passed under any other).
	for _, name := range []string{"example.com/app:v1", "example.com/else:v2"} {
		wantRefused(t, check(p, ref(t, name), digestA, bundled(t, k, testimages.CosignV3Statement(t, digestA))), "default", "claims no identity")
	}
	exactRepo := mustParse(t, fmt.Sprintf(`{"default": [{"type": "sigstoreSigned", "keyData": %q, "signedIdentity": {"type": "exactRepository", "dockerRepository": "example.com/b"}}]}`, keyData(k)))
	wantRefused(t, check(exactRepo, ref(t, "example.com/b:v1"), digestA, bundled(t, k, testimages.CosignV3Statement(t, digestA))), "default", "claims no identity")
	wantRefused(t, check(p, app, digestA, bundled(t, k, testimages.CosignV3Statement(t, digestB))), "default", "digest mismatch")
	wantRefused(t, check(p, app, digestA, bundled(t, other, testimages.CosignV3Statement(t, digestA))), "default", "does not verify")
}
