package testimages

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What cosign writes (sigstore's simple-signing format in an OCI image).
const (
	cosignPayloadMediaType    = "application/vnd.dev.cosign.simplesigning.v1+json"
	cosignSignatureAnnotation = "dev.cosignproject.cosign/signature"
)

// CosignKey is a key pair made by a test, used as `cosign sign --key`
// uses one: ECDSA P-256 (cosign generate-key-pair) or Ed25519.
type CosignKey struct {
	signer crypto.Signer
	// PublicPEM is the public key as cosign.pub holds it (PKIX, "PUBLIC KEY").
	PublicPEM []byte
}

// NewCosignKey makes a key pair: kind is "ecdsa" (P-256) or "ed25519".
func NewCosignKey(t testing.TB, kind string) *CosignKey {
	t.Helper()
	var signer crypto.Signer
	var err error
	switch kind {
	case "ecdsa":
		signer, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ed25519":
		_, signer, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("key kind %q: want ecdsa or ed25519", kind)
	}
	if err != nil {
		t.Fatalf("generate %s key: %v", kind, err)
	}
	der, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		t.Fatalf("marshal public key: %v", err)
	}
	return &CosignKey{signer: signer, PublicPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})}
}

// Sign returns the base64 signature of payload, as cosign puts it in the
// annotation: ECDSA over SHA-256 (ASN.1), Ed25519 over the bytes.
func (k *CosignKey) Sign(t testing.TB, payload []byte) string {
	t.Helper()
	var sig []byte
	var err error
	switch s := k.signer.(type) {
	case *ecdsa.PrivateKey:
		sum := sha256.Sum256(payload)
		sig, err = ecdsa.SignASN1(rand.Reader, s, sum[:])
	case ed25519.PrivateKey:
		sig = ed25519.Sign(s, payload)
	}
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

// CosignPayload is the simple-signing payload cosign signs: identity is
// the repository (cosign writes no tag), digest the image's manifest or
// index digest.
func CosignPayload(t testing.TB, identity, digest string) []byte {
	t.Helper()
	var p struct {
		Critical struct {
			Identity struct {
				DockerReference string `json:"docker-reference"`
			} `json:"identity"`
			Image struct {
				DockerManifestDigest string `json:"docker-manifest-digest"`
			} `json:"image"`
			Type string `json:"type"`
		} `json:"critical"`
		Optional map[string]any `json:"optional"`
	}
	p.Critical.Identity.DockerReference = identity
	p.Critical.Image.DockerManifestDigest = digest
	p.Critical.Type = "cosign container image signature"
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// CosignLayer is one signature of a signature manifest.
type CosignLayer struct {
	Payload   []byte
	Signature string // base64; "" leaves the annotation out
}

// PushCosignSignatures writes the signature manifest cosign would for the
// image with this digest in repo (relative to this registry): tag
// sha256-<hex>.sig, one layer per signature.
func (r *Registry) PushCosignSignatures(t testing.TB, repo, digest string, layers ...CosignLayer) {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		add := mutate.Addendum{Layer: static.NewLayer(l.Payload, cosignPayloadMediaType)}
		if l.Signature != "" {
			add.Annotations = map[string]string{cosignSignatureAnnotation: l.Signature}
		}
		var err error
		if img, err = mutate.Append(img, add); err != nil {
			t.Fatalf("signature manifest: %v", err)
		}
	}
	r.Push(t, repo+":"+strings.Replace(digest, ":", "-", 1)+".sig", img)
}

// SignCosign signs the image with this digest in repo with key, as
// `cosign sign --key` does (identity: the registry's repo).
func (r *Registry) SignCosign(t testing.TB, key *CosignKey, repo, digest string) {
	t.Helper()
	payload := CosignPayload(t, r.Ref(repo), digest)
	r.PushCosignSignatures(t, repo, digest, CosignLayer{Payload: payload, Signature: key.Sign(t, payload)})
}

// SigstoreBundleMediaType is a sigstore bundle v0.3, as cosign attaches
// one (--new-bundle-format) as an OCI 1.1 referrer.
const SigstoreBundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"

// CosignV3Statement is the in-toto statement cosign v3 (`sign --key`,
// the new bundle format) signs for an image, as the real CLI writes it
// (checked in test/integration's TestSignaturePolicyCosignCLI): the
// digest as the only subject, no name, and cosign's signature predicate
// empty, so it claims no identity.
func CosignV3Statement(t testing.TB, digest string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"digest": map[string]string{"sha256": strings.TrimPrefix(digest, "sha256:")}, "annotations": map[string]string{}}},
		"predicateType": "https://sigstore.dev/cosign/sign/v1",
		"predicate":     map[string]any{},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BundleStatement is an in-toto statement with cosign's signature
// predicate holding the simple-signing claims (identity: the repository),
// as a signer that binds a name writes it; cosign v3 itself binds only
// the digest (CosignV3Statement).
func BundleStatement(t testing.TB, identity, digest string) []byte {
	t.Helper()
	var claims map[string]any
	if err := json.Unmarshal(CosignPayload(t, identity, digest), &claims); err != nil {
		t.Fatal(err)
	}
	st := map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"name": identity, "digest": map[string]string{"sha256": strings.TrimPrefix(digest, "sha256:")}}},
		"predicateType": "https://sigstore.dev/cosign/sign/v1",
		"predicate":     claims,
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Bundle wraps statement in a sigstore bundle with one DSSE signature
// by k (a key-based bundle: no certificate, no transparency log entry).
func (k *CosignKey) Bundle(t testing.TB, statement []byte) []byte {
	t.Helper()
	const payloadType = "application/vnd.in-toto+json"
	pae := fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(statement), statement)
	b, err := json.Marshal(map[string]any{
		"mediaType":            SigstoreBundleMediaType,
		"verificationMaterial": map[string]any{"publicKey": map[string]string{"hint": "test"}},
		"dsseEnvelope": map[string]any{
			"payload":     base64.StdEncoding.EncodeToString(statement),
			"payloadType": payloadType,
			"signatures":  []any{map[string]string{"sig": k.Sign(t, pae)}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// AttachBundle pushes bundle as an OCI 1.1 referrer of the manifest
// subject (repo relative to this registry), by digest, as cosign does.
// The in-process registry lists a referrer's config media type as its
// artifactType, so the config carries the bundle type.
func (r *Registry) AttachBundle(t testing.TB, repo string, subject v1.Descriptor, bundle []byte) {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, SigstoreBundleMediaType)
	img, err := mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(bundle, SigstoreBundleMediaType)})
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.Subject(img, subject).(v1.Image)
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewDigest(r.Ref(repo)+"@"+d.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, r.remoteOptions()...); err != nil {
		t.Fatalf("push referrer of %s: %v", subject.Digest, err)
	}
}

// DescriptorOf is the descriptor of img's manifest, to attach referrers to.
func DescriptorOf(t testing.TB, img v1.Image) v1.Descriptor {
	t.Helper()
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	mt, err := img.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return v1.Descriptor{MediaType: mt, Digest: d, Size: int64(len(raw))}
}
