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
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
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
