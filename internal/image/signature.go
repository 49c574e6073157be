package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthcri/berth/internal/errdefs"
)

// Cosign's signature format (the `sha256-<hex>.sig` tag): each layer of
// the tag's manifest is a simple-signing payload, its signature in an
// annotation.
const (
	CosignPayloadMediaType    = "application/vnd.dev.cosign.simplesigning.v1+json"
	CosignSignatureAnnotation = "dev.cosignproject.cosign/signature"
)

// Limits on what a signature tag may make a pull read.
const (
	maxCosignLayers      = 32
	maxCosignPayloadSize = 1 << 20
)

// SignaturePolicy decides whether an image may be stored, from where it
// comes and its signatures (internal/sigpolicy, docs/signature-policy.md).
// A pull takes the policy once, with its other settings.
type SignaturePolicy interface {
	// Precheck refuses, before any registry is asked, an image whose scope
	// refuses every image; nil otherwise.
	Precheck(ref Named) error
	// Check decides on ref, whose top-level manifest (or index) has digest.
	// in.Signatures is called at most once, only when a requirement needs
	// signatures. A refusal is a *SignatureError.
	Check(ctx context.Context, in SignatureCheck) error
}

// SignatureCheck is what a policy decides on.
type SignatureCheck struct {
	// Ref is the image as asked for (normalized); zero for an unnamed
	// imported image.
	Ref Named
	// Digest is the digest of the top-level manifest or index the
	// reference resolved to: what a cosign signature names.
	Digest string
	// Source says where signatures are looked for, for messages.
	Source string
	// Signatures fetches the image's cosign signatures; none is no error.
	Signatures func(ctx context.Context) ([]CosignSignature, error)
}

// CosignSignature is one signature of the image: a layer of a cosign
// signature manifest (the simple-signing payload, its digest already
// checked, and the base64 signature over it from the layer's
// annotation), or one signature of the DSSE envelope of a sigstore
// bundle attached as an OCI 1.1 referrer (Bundle set: Payload is the
// envelope's payload, an in-toto statement, PayloadType its type, and
// the signature is over DSSE's pre-authentication encoding of both).
type CosignSignature struct {
	Payload   []byte
	Signature string
	// LayerDigest names the payload or bundle blob, for messages.
	LayerDigest string
	Bundle      bool
	PayloadType string
}

// Sigstore bundles as cosign attaches them with --new-bundle-format.
const (
	sigstoreBundlePrefix = "application/vnd.dev.sigstore.bundle"
	ociEmptyMediaType    = "application/vnd.oci.empty.v1+json"
	maxReferrers         = 16
)

// SignatureError is a pull or import the signature policy refused.
type SignatureError struct {
	// Image is the reference as asked for, Digest what it resolved to
	// ("" when refused before asking the registry).
	Image, Digest string
	// Scope is the policy scope that applied (`docker "example.com/app"`,
	// `docker ""`, `default`).
	Scope string
	// Reason says why: no signature, wrong key, digest mismatch…
	Reason string
}

// Message is the refusal without a prefix; the CRI layer puts the
// kubelet's SignatureValidationFailed before it.
func (e *SignatureError) Message() string {
	img := e.Image
	if img == "" {
		img = "unnamed image"
	}
	if e.Digest != "" {
		img += " (" + e.Digest + ")"
	}
	return fmt.Sprintf("image %s refused by signature policy scope %s: %s", img, e.Scope, e.Reason)
}

func (e *SignatureError) Error() string { return "signature policy: " + e.Message() }

// Is makes a refusal a FailedPrecondition for callers that map kinds to
// codes (the admin service's imports).
func (e *SignatureError) Is(target error) bool { return target == errdefs.ErrFailedPrecondition }

// AsSignatureError finds a policy refusal in err's chain.
func AsSignatureError(err error) (*SignatureError, bool) {
	var se *SignatureError
	ok := errors.As(err, &se)
	return se, ok
}

// cosignSignatureTag is the tag cosign stores the signatures of the image
// with this digest under.
func cosignSignatureTag(digest string) string {
	return strings.Replace(digest, ":", "-", 1) + ".sig"
}

// cosignSignatures reads the signatures cosign stored for digest in this
// repository: none when the tag does not exist. Every payload is checked
// against the digest its descriptor gives.
func (c *repoClient) cosignSignatures(ctx context.Context, digest string) ([]CosignSignature, error) {
	tag := c.repo.Tag(cosignSignatureTag(digest))
	desc, err := remote.Get(tag, c.opts...)
	if err != nil {
		if err := classify(err); errors.Is(err, errdefs.ErrNotFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("read signature tag %s: %w", tag.TagStr(), classify(err))
	}
	m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		return nil, fmt.Errorf("signature tag %s: parse manifest: %w", tag.TagStr(), err)
	}
	var sigs []CosignSignature
	for _, l := range m.Layers {
		if string(l.MediaType) != CosignPayloadMediaType {
			continue
		}
		if len(sigs) == maxCosignLayers {
			break
		}
		if l.Size > maxCosignPayloadSize || l.Size < 0 {
			return nil, fmt.Errorf("signature tag %s: payload %s is %d bytes, more than %d", tag.TagStr(), l.Digest, l.Size, maxCosignPayloadSize)
		}
		body, err := c.readSmallBlob(ctx, l.Digest.String(), l.Size)
		if err != nil {
			return nil, fmt.Errorf("signature tag %s: %w", tag.TagStr(), err)
		}
		sigs = append(sigs, CosignSignature{Payload: body, Signature: l.Annotations[CosignSignatureAnnotation], LayerDigest: l.Digest.String()})
	}
	return sigs, nil
}

// readSmallBlob downloads a blob of known size and checks its digest.
func (c *repoClient) readSmallBlob(ctx context.Context, digest string, size int64) ([]byte, error) {
	rc, err := c.openBlob(ctx, digest)
	if err != nil {
		return nil, fmt.Errorf("fetch blob %s: %w", digest, err)
	}
	defer rc.Close()
	body, err := io.ReadAll(io.LimitReader(rc, size+1))
	if err != nil {
		return nil, fmt.Errorf("read blob %s: %w", digest, err)
	}
	sum := sha256.Sum256(body)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest || int64(len(body)) != size {
		return nil, fmt.Errorf("blob %s: received %d bytes with digest %s: %w", digest, len(body), got, errdefs.ErrInvalidArgument)
	}
	return body, nil
}

// sigstoreBundle is the part of a sigstore bundle (v0.1–v0.3, protobuf
// JSON) berth reads: the DSSE envelope. A message signature (no
// envelope) signs a blob, not an image, and is skipped.
type sigstoreBundle struct {
	MediaType    string `json:"mediaType"`
	DSSEEnvelope *struct {
		Payload     string `json:"payload"`
		PayloadType string `json:"payloadType"`
		Signatures  []struct {
			Sig string `json:"sig"`
		} `json:"signatures"`
	} `json:"dsseEnvelope"`
}

// bundleSignatures reads the sigstore bundles attached to digest as OCI
// 1.1 referrers (the Referrers API, or its tag fallback): one
// CosignSignature per signature of each bundle's DSSE envelope.
func (c *repoClient) bundleSignatures(ctx context.Context, digest string) ([]CosignSignature, error) {
	d := c.repo.Digest(digest)
	idx, err := remote.Referrers(d, c.opts...)
	if err != nil {
		return nil, fmt.Errorf("list referrers of %s: %w", digest, classify(err))
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("referrers of %s: %w", digest, err)
	}
	var sigs []CosignSignature
	seen := 0
	for _, desc := range im.Manifests {
		// Registries that report the config's media type rather than the
		// manifest's artifactType show cosign's bundles as the empty type.
		switch at := desc.ArtifactType; {
		case at == "", at == ociEmptyMediaType, strings.HasPrefix(at, sigstoreBundlePrefix):
		default:
			continue
		}
		if seen == maxReferrers {
			break
		}
		seen++
		got, err := remote.Get(c.repo.Digest(desc.Digest.String()), c.opts...)
		if err != nil {
			return nil, fmt.Errorf("referrer %s: %w", desc.Digest, classify(err))
		}
		m, err := v1.ParseManifest(bytes.NewReader(got.Manifest))
		if err != nil {
			return nil, fmt.Errorf("referrer %s: parse manifest: %w", desc.Digest, err)
		}
		for _, l := range m.Layers {
			if !strings.HasPrefix(string(l.MediaType), sigstoreBundlePrefix) {
				continue
			}
			if l.Size > maxCosignPayloadSize || l.Size < 0 {
				return nil, fmt.Errorf("referrer %s: bundle %s is %d bytes, more than %d", desc.Digest, l.Digest, l.Size, maxCosignPayloadSize)
			}
			body, err := c.readSmallBlob(ctx, l.Digest.String(), l.Size)
			if err != nil {
				return nil, fmt.Errorf("referrer %s: %w", desc.Digest, err)
			}
			var b sigstoreBundle
			if err := json.Unmarshal(body, &b); err != nil || b.DSSEEnvelope == nil {
				continue // not a bundle, or one with a message signature
			}
			payload, err := base64.StdEncoding.DecodeString(b.DSSEEnvelope.Payload)
			if err != nil {
				continue
			}
			for _, sg := range b.DSSEEnvelope.Signatures {
				if len(sigs) == maxCosignLayers {
					return sigs, nil
				}
				sigs = append(sigs, CosignSignature{Payload: payload, Signature: sg.Sig, LayerDigest: l.Digest.String(), Bundle: true, PayloadType: b.DSSEEnvelope.PayloadType})
			}
		}
	}
	return sigs, nil
}

// imageSignatures reads both kinds: the .sig tag, then the referrers. A
// registry that fails the referrers listing still has its .sig
// signatures checked.
func (c *repoClient) imageSignatures(ctx context.Context, digest string) ([]CosignSignature, error) {
	sigs, err := c.cosignSignatures(ctx, digest)
	if err != nil {
		return nil, err
	}
	bundles, berr := c.bundleSignatures(ctx, digest)
	if berr != nil && len(sigs) == 0 {
		return nil, berr
	}
	return append(sigs, bundles...), nil
}
