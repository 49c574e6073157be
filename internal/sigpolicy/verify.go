package sigpolicy

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/berthcri/berth/internal/image"
)

// cosignSignatureType is the critical.type of a cosign simple-signing
// payload.
const cosignSignatureType = "cosign container image signature"

var _ image.SignaturePolicy = (*Policy)(nil)

func refString(ref image.Named) string {
	if ref.Path == "" {
		return ""
	}
	return ref.String()
}

// Precheck refuses an image whose scope holds a reject requirement: no
// registry need be asked.
func (p *Policy) Precheck(ref image.Named) error {
	sc := p.Match(ref)
	for _, r := range sc.Requirements {
		if r.Type == TypeReject {
			return &image.SignatureError{Image: refString(ref), Scope: sc.Name, Reason: "the scope rejects every image (reject)"}
		}
	}
	return nil
}

// Check applies the requirements of ref's scope: all of them must be met.
// A sigstoreSigned requirement is met by one signature that verifies with
// one of its keys and whose payload names in.Digest and an identity the
// requirement accepts for ref.
func (p *Policy) Check(ctx context.Context, in image.SignatureCheck) error {
	sc := p.Match(in.Ref)
	refuse := func(reason string) error {
		return &image.SignatureError{Image: refString(in.Ref), Digest: in.Digest, Scope: sc.Name, Reason: reason}
	}
	var sigs []image.CosignSignature
	fetched := false
	for _, r := range sc.Requirements {
		switch r.Type {
		case TypeInsecureAcceptAnything:
		case TypeReject:
			return refuse("the scope rejects every image (reject)")
		case TypeSigstoreSigned:
			if !fetched {
				var err error
				if in.Signatures != nil {
					if sigs, err = in.Signatures(ctx); err != nil {
						return fmt.Errorf("read signatures of %s: %w", in.Digest, err)
					}
				}
				fetched = true
			}
			if len(sigs) == 0 {
				return refuse(fmt.Sprintf("no signature: %s requires one and none was found (%s)", TypeSigstoreSigned, in.Source))
			}
			var why []string
			ok := false
			for _, s := range sigs {
				err := r.verify(s, in.Ref, in.Digest)
				if err == nil {
					ok = true
					break
				}
				why = append(why, fmt.Sprintf("signature %s: %v", shortDigest(s.LayerDigest), err))
			}
			if !ok {
				return refuse(fmt.Sprintf("no valid signature among %d (%s)", len(sigs), strings.Join(why, "; ")))
			}
		default:
			return refuse(fmt.Sprintf("requirement %q cannot be checked", r.Type))
		}
	}
	return nil
}

func shortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

// payload is a cosign simple-signing payload; only what is checked is read.
type payload struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional json.RawMessage `json:"optional"`
}

var errNoKey = errors.New("does not verify with the trusted key")

// verify checks one signature: the signature over the payload bytes with
// one of the keys first (the payload is not read before it is trusted),
// then the payload's type, digest and identity.
func (r Requirement) verify(s image.CosignSignature, ref image.Named, digest string) error {
	if s.Signature == "" {
		return fmt.Errorf("the payload layer has no %s annotation", image.CosignSignatureAnnotation)
	}
	raw, err := base64.StdEncoding.DecodeString(s.Signature)
	if err != nil {
		return fmt.Errorf("the signature annotation is not base64: %w", err)
	}
	signed := s.Payload
	if s.Bundle {
		signed = pae(s.PayloadType, s.Payload)
	}
	var signer *Key
	for i := range r.Keys {
		if r.Keys[i].verifier.VerifySignature(bytes.NewReader(raw), bytes.NewReader(signed)) == nil {
			signer = &r.Keys[i]
			break
		}
	}
	if signer == nil {
		names := make([]string, len(r.Keys))
		for i, k := range r.Keys {
			names[i] = k.Name
		}
		return fmt.Errorf("%w(s) %s (signed by another key, or the payload was changed after signing)", errNoKey, strings.Join(names, ", "))
	}
	var identity string
	if s.Bundle {
		id, err := statementClaims(s, digest)
		if err != nil {
			return fmt.Errorf("signed by %s (sigstore bundle), but %w", signer.Name, err)
		}
		if id == "" {
			// Bound to the digest alone (cosign v3's statement): the key
			// vouched for the content, not for the name it is pulled
			// under, and every signedIdentity asks for the name. As
			// containers/image keeps the two apart, a claim that is not
			// there cannot be matched: refused, never skipped (issue 34).
			return fmt.Errorf("signed by %s for %s (sigstore bundle), but the statement claims no identity (critical.identity.docker-reference) for signedIdentity %s to match %s against", signer.Name, digest, r.Identity.typeName(), refString(ref))
		}
		identity = id
	} else {
		var pl payload
		if err := json.Unmarshal(s.Payload, &pl); err != nil {
			return fmt.Errorf("signed by %s, but the payload does not parse: %w", signer.Name, err)
		}
		if pl.Critical.Type != cosignSignatureType {
			return fmt.Errorf("signed by %s, but the payload's critical.type is %q, not %q", signer.Name, pl.Critical.Type, cosignSignatureType)
		}
		if got := pl.Critical.Image.DockerManifestDigest; got != digest {
			return fmt.Errorf("digest mismatch: signed by %s for %s, not for the pulled %s", signer.Name, got, digest)
		}
		identity = pl.Critical.Identity.DockerReference
	}
	if err := r.Identity.match(identity, ref); err != nil {
		return fmt.Errorf("signed by %s for %s, but %w", signer.Name, digest, err)
	}
	return nil
}

// In-toto statements in sigstore bundles, as cosign signs images with
// --new-bundle-format.
const (
	inTotoPayloadType     = "application/vnd.in-toto+json"
	inTotoStatementV1     = "https://in-toto.io/Statement/v1"
	inTotoStatementV01    = "https://in-toto.io/Statement/v0.1"
	cosignSignPredicateV1 = "https://sigstore.dev/cosign/sign/v1"
	dssePAEPrefix         = "DSSEv1"
	sha256AlgorithmInToto = "sha256"
	statementDigestPrefix = "sha256:"
)

// pae is DSSE's pre-authentication encoding, what an envelope's
// signatures sign.
func pae(payloadType string, payload []byte) []byte {
	return fmt.Appendf(nil, "%s %d %s %d %s", dssePAEPrefix, len(payloadType), payloadType, len(payload), payload)
}

// statement is what berth reads of an in-toto statement.
type statement struct {
	Type    string `json:"_type"`
	Subject []struct {
		Name   string            `json:"name"`
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	PredicateType string  `json:"predicateType"`
	Predicate     payload `json:"predicate"`
}

// statementClaims checks a verified bundle statement: an in-toto
// statement with cosign's signature predicate whose subject names the
// pulled digest; it returns the identity the predicate claims, "" when it
// claims none.
func statementClaims(s image.CosignSignature, digest string) (string, error) {
	if s.PayloadType != inTotoPayloadType {
		return "", fmt.Errorf("its payload type is %q, not %q", s.PayloadType, inTotoPayloadType)
	}
	var st statement
	if err := json.Unmarshal(s.Payload, &st); err != nil {
		return "", fmt.Errorf("its statement does not parse: %w", err)
	}
	if st.Type != inTotoStatementV1 && st.Type != inTotoStatementV01 {
		return "", fmt.Errorf("its statement type is %q", st.Type)
	}
	if st.PredicateType != cosignSignPredicateV1 {
		return "", fmt.Errorf("it is an attestation of type %q, not a signature (%s)", st.PredicateType, cosignSignPredicateV1)
	}
	want := strings.TrimPrefix(digest, statementDigestPrefix)
	var named []string
	found := false
	for _, sub := range st.Subject {
		d := sub.Digest[sha256AlgorithmInToto]
		named = append(named, statementDigestPrefix+d)
		if d == want {
			found = true
		}
	}
	if !found {
		return "", fmt.Errorf("digest mismatch: its subjects are %v, not the pulled %s", named, digest)
	}
	if got := st.Predicate.Critical.Image.DockerManifestDigest; got != "" && got != digest {
		return "", fmt.Errorf("digest mismatch: its predicate names %s, not the pulled %s", got, digest)
	}
	// cosign v3 signs a statement that names the digest alone (its
	// predicate is empty): "" tells the caller there is no identity, which
	// no signedIdentity accepts (verify).
	return st.Predicate.Critical.Identity.DockerReference, nil
}

// match tells whether a signature claiming identity signed (its
// docker-reference) may stand for ref, as containers/image's
// signedIdentity does. An unnamed image (an import without a name) has
// no identity to match but exactReference and exactRepository.
func (id Identity) match(signed string, ref image.Named) error {
	sig, err := image.ParseName(signed)
	if err != nil {
		return fmt.Errorf("its identity %q does not parse: %v", signed, err)
	}
	if ref.Path == "" && id.Type != identityExactReference && id.Type != identityExactRepository {
		return fmt.Errorf("the image has no name to match the signed identity %q against (%s)", signed, id.Type)
	}
	exact := func(want image.Named) bool {
		return sig.Repo() == want.Repo() && sig.Tag == want.Tag && sig.Digest == want.Digest && (sig.Tag != "" || sig.Digest != "")
	}
	var ok bool
	want := ref.String()
	switch id.Type {
	case identityMatchExact:
		ok = exact(ref)
	case identityMatchRepoDigestOrExact, "":
		ok, want = repoDigestOrExact(sig, ref, exact)
	case identityMatchRepository:
		ok, want = sig.Repo() == ref.Repo(), ref.Repo()
	case identityExactReference:
		ok, want = sig.String() == id.DockerReference, id.DockerReference
	case identityExactRepository:
		ok, want = sig.Repo() == id.DockerRepository, id.DockerRepository
	case identityRemapIdentity:
		mapped := ref
		if rest, found := cutPrefix(ref.Repo(), id.Prefix); found {
			if m, err := image.ParseName(id.SignedPrefix + rest); err == nil {
				mapped.Domain, mapped.Path = m.Domain, m.Path
			}
		}
		ok, want = repoDigestOrExact(sig, mapped, exact)
	default:
		return fmt.Errorf("signedIdentity %q is unknown", id.Type)
	}
	if !ok {
		return fmt.Errorf("its identity %q does not match %s (signedIdentity %s)", signed, want, id.Type)
	}
	return nil
}

// typeName is the signedIdentity type as the policy names it (the
// default spelled out).
func (id Identity) typeName() string {
	if id.Type == "" {
		return identityMatchRepoDigestOrExact
	}
	return id.Type
}

// repoDigestOrExact: a reference by digest needs the same repository
// (its digest is checked against the payload's anyway), one by tag the
// exact repo:tag.
func repoDigestOrExact(sig, ref image.Named, exact func(image.Named) bool) (bool, string) {
	if ref.Digest != "" {
		return sig.Repo() == ref.Repo(), ref.Repo()
	}
	return exact(ref), ref.String()
}

// cutPrefix cuts prefix off repo at a component boundary.
func cutPrefix(repo, prefix string) (string, bool) {
	if repo == prefix {
		return "", true
	}
	if strings.HasPrefix(repo, prefix+"/") {
		return repo[len(prefix):], true
	}
	return "", false
}
