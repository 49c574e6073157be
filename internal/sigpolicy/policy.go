// Package sigpolicy reads an image signature policy, a containers/image
// policy.json (the file CRI-O and podman read), and decides with it which
// images berth may store: per registry, repository or image scope, accept
// anything, reject, or require a cosign signature by one of some public
// keys, verified offline (docs/signature-policy.md, decision 2400).
package sigpolicy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/berthcri/berth/internal/image"
)

// Requirement types (containers-policy.json(5)).
const (
	TypeInsecureAcceptAnything = "insecureAcceptAnything"
	TypeReject                 = "reject"
	TypeSigstoreSigned         = "sigstoreSigned"
	typeSignedBy               = "signedBy"
)

// signedIdentity types.
const (
	identityMatchExact             = "matchExact"
	identityMatchRepoDigestOrExact = "matchRepoDigestOrExact"
	identityMatchRepository        = "matchRepository"
	identityExactReference         = "exactReference"
	identityExactRepository        = "exactRepository"
	identityRemapIdentity          = "remapIdentity"
)

// dockerTransport is the only transport berth pulls with; the policy's
// other transports (docker-daemon, oci, dir …) are read and ignored.
const dockerTransport = "docker"

// Policy is a parsed policy file. It is never modified once loaded.
type Policy struct {
	// Path is the file it was read from.
	Path string
	// Digest is sha256 of the file's bytes and of the key files it names:
	// a reload that reads the same bytes changes nothing.
	Digest string

	global           []Requirement
	transportDefault []Requirement // transports.docker[""], nil when absent
	scopes           map[string][]Requirement
}

// Requirement is one entry of a scope's list; an image must satisfy all
// of its scope's requirements.
type Requirement struct {
	Type string
	// Keys are a sigstoreSigned requirement's public keys: a signature by
	// any one of them counts.
	Keys []Key
	// Identity is a sigstoreSigned requirement's signedIdentity.
	Identity Identity
}

// Key is one trusted public key.
type Key struct {
	// Name says where it came from: its path, or keyData[i].
	Name     string
	verifier signature.Verifier
}

// Identity is a signedIdentity: which image names a signature's claimed
// identity (critical.identity.docker-reference) may stand for.
type Identity struct {
	Type string
	// DockerReference (exactReference), DockerRepository
	// (exactRepository), Prefix and SignedPrefix (remapIdentity).
	DockerReference  string
	DockerRepository string
	Prefix           string
	SignedPrefix     string
}

// Load reads the policy at path. An empty path or an absent file is no
// policy (nil): every image is accepted, as without one.
func Load(path string) (*Policy, error) {
	if path == "" {
		return nil, nil
	}
	data, err := readConfigFile(path, maxPolicySize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read signature policy %s: %w", path, err)
	}
	p, err := Parse(data, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("signature policy %s: %w", path, err)
	}
	p.Path = path
	return p, nil
}

// A policy and its key files are input too: bounded before they are read.
const (
	maxPolicySize  = 1 << 20
	maxKeyFileSize = 64 << 10
)

// readConfigFile reads the regular file at path, at most limit bytes: a
// larger one is refused, and so is anything else (a FIFO would block the
// reader, /dev/zero would never end). The file is opened without blocking
// and checked after it is open, so what is read is what was checked.
func readConfigFile(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes: refused", path, limit)
	}
	return data, nil
}

// DigestOf is p's Digest, "" for no policy.
func DigestOf(p *Policy) string {
	if p == nil {
		return ""
	}
	return p.Digest
}

type policyFile struct {
	Default    *[]json.RawMessage                      `json:"default"`
	Transports map[string]map[string][]json.RawMessage `json:"transports"`
}

// Parse reads policy.json bytes; relative key paths are taken from dir.
// Unknown fields, requirement types berth cannot check and malformed
// scopes refuse the whole file, as containers/image does.
func Parse(data []byte, dir string) (*Policy, error) {
	var f policyFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse: data after the top-level object")
	}
	if f.Default == nil {
		return nil, fmt.Errorf(`"default" is required (use [{"type": %q}] to accept images no scope names)`, TypeInsecureAcceptAnything)
	}
	ps := &parser{dir: dir, h: sha256.New()}
	ps.h.Write(data)
	p := &Policy{scopes: map[string][]Requirement{}}
	var err error
	if p.global, err = ps.requirements(*f.Default); err != nil {
		return nil, fmt.Errorf("default: %w", err)
	}
	scopes := make([]string, 0, len(f.Transports[dockerTransport]))
	for scope := range f.Transports[dockerTransport] {
		scopes = append(scopes, scope)
	}
	// In order, so that the key files feed the digest in a stable order.
	sort.Strings(scopes)
	for _, scope := range scopes {
		raw := f.Transports[dockerTransport][scope]
		reqs, err := ps.requirements(raw)
		if err != nil {
			return nil, fmt.Errorf("transports.docker[%q]: %w", scope, err)
		}
		if scope == "" {
			p.transportDefault = reqs
			continue
		}
		if err := validateScope(scope); err != nil {
			return nil, fmt.Errorf("transports.docker[%q]: %w", scope, err)
		}
		p.scopes[scope] = reqs
	}
	p.Digest = "sha256:" + hex.EncodeToString(ps.h.Sum(nil))
	return p, nil
}

// parser reads requirements; h hashes the policy file and every key file
// it names, so that a reload sees a key file replaced under the same
// policy as a change.
type parser struct {
	dir string
	h   hash.Hash
}

func (ps *parser) requirements(raw []json.RawMessage) ([]Requirement, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("a list of requirements must not be empty (use [{\"type\": %q}])", TypeInsecureAcceptAnything)
	}
	out := make([]Requirement, 0, len(raw))
	for i, r := range raw {
		req, err := ps.requirement(r)
		if err != nil {
			return nil, fmt.Errorf("requirement %d: %w", i, err)
		}
		out = append(out, req)
	}
	return out, nil
}

func strict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

type sigstoreSignedJSON struct {
	Type                string          `json:"type"`
	KeyPath             string          `json:"keyPath"`
	KeyPaths            []string        `json:"keyPaths"`
	KeyData             string          `json:"keyData"`
	KeyDatas            []string        `json:"keyDatas"`
	SignedIdentity      json.RawMessage `json:"signedIdentity"`
	Fulcio              json.RawMessage `json:"fulcio"`
	PKI                 json.RawMessage `json:"pki"`
	RekorPublicKeyPath  string          `json:"rekorPublicKeyPath"`
	RekorPublicKeyPaths []string        `json:"rekorPublicKeyPaths"`
	RekorPublicKeyData  string          `json:"rekorPublicKeyData"`
	RekorPublicKeyDatas []string        `json:"rekorPublicKeyDatas"`
}

func (ps *parser) requirement(data []byte) (Requirement, error) {
	var head struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return Requirement{}, err
	}
	switch head.Type {
	case TypeInsecureAcceptAnything, TypeReject:
		var r struct {
			Type string `json:"type"`
		}
		if err := strict(data, &r); err != nil {
			return Requirement{}, fmt.Errorf("%s: %w", head.Type, err)
		}
		return Requirement{Type: head.Type}, nil
	case TypeSigstoreSigned:
		return ps.sigstoreSigned(data)
	case typeSignedBy:
		return Requirement{}, fmt.Errorf("%s (GPG simple signing) is not supported: berth checks %s (cosign) signatures only", typeSignedBy, TypeSigstoreSigned)
	case "":
		return Requirement{}, fmt.Errorf(`"type" is required`)
	}
	return Requirement{}, fmt.Errorf("unknown requirement type %q (berth knows %s, %s, %s)", head.Type, TypeInsecureAcceptAnything, TypeReject, TypeSigstoreSigned)
}

func (ps *parser) sigstoreSigned(data []byte) (Requirement, error) {
	var r sigstoreSignedJSON
	if err := strict(data, &r); err != nil {
		return Requirement{}, fmt.Errorf("%s: %w", TypeSigstoreSigned, err)
	}
	switch {
	case len(r.Fulcio) > 0 || len(r.PKI) > 0:
		return Requirement{}, fmt.Errorf("%s: fulcio and pki (keyless, certificate-based) signatures are not supported: berth verifies offline with public keys only", TypeSigstoreSigned)
	case r.RekorPublicKeyPath != "" || len(r.RekorPublicKeyPaths) > 0 || r.RekorPublicKeyData != "" || len(r.RekorPublicKeyDatas) > 0:
		return Requirement{}, fmt.Errorf("%s: rekorPublicKey* (transparency log entries) are not supported: berth verifies offline with public keys only", TypeSigstoreSigned)
	}
	given := 0
	for _, set := range []bool{r.KeyPath != "", r.KeyPaths != nil, r.KeyData != "", r.KeyDatas != nil} {
		if set {
			given++
		}
	}
	if given != 1 {
		return Requirement{}, fmt.Errorf("%s: exactly one of keyPath, keyPaths, keyData and keyDatas is required", TypeSigstoreSigned)
	}
	req := Requirement{Type: TypeSigstoreSigned}
	paths := r.KeyPaths
	if r.KeyPath != "" {
		paths = []string{r.KeyPath}
	}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			p = filepath.Join(ps.dir, p)
		}
		pemData, err := readConfigFile(p, maxKeyFileSize)
		if err != nil {
			return Requirement{}, fmt.Errorf("%s: read key: %w", TypeSigstoreSigned, err)
		}
		ps.h.Write(pemData)
		k, err := parseKey(p, pemData)
		if err != nil {
			return Requirement{}, fmt.Errorf("%s: %w", TypeSigstoreSigned, err)
		}
		req.Keys = append(req.Keys, k)
	}
	datas := r.KeyDatas
	if r.KeyData != "" {
		datas = []string{r.KeyData}
	}
	for i, d := range datas {
		pemData, err := base64.StdEncoding.DecodeString(d)
		if err != nil {
			return Requirement{}, fmt.Errorf("%s: keyData[%d] is not base64: %w", TypeSigstoreSigned, i, err)
		}
		k, err := parseKey(fmt.Sprintf("keyData[%d]", i), pemData)
		if err != nil {
			return Requirement{}, fmt.Errorf("%s: %w", TypeSigstoreSigned, err)
		}
		req.Keys = append(req.Keys, k)
	}
	if len(req.Keys) == 0 {
		return Requirement{}, fmt.Errorf("%s: no key given", TypeSigstoreSigned)
	}
	id, err := parseIdentity(r.SignedIdentity)
	if err != nil {
		return Requirement{}, fmt.Errorf("%s: signedIdentity: %w", TypeSigstoreSigned, err)
	}
	req.Identity = id
	return req, nil
}

// parseKey reads one PEM public key (cosign.pub): ECDSA P-256 or Ed25519.
func parseKey(name string, pemData []byte) (Key, error) {
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(pemData)
	if err != nil {
		return Key{}, fmt.Errorf("key %s: %w", name, err)
	}
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return Key{}, fmt.Errorf("key %s: ECDSA on %s: only P-256 (cosign's) is supported", name, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return Key{}, fmt.Errorf("key %s: %T: only ECDSA P-256 and Ed25519 keys are supported", name, pub)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return Key{}, fmt.Errorf("key %s: %w", name, err)
	}
	return Key{Name: name, verifier: v}, nil
}

func parseIdentity(raw json.RawMessage) (Identity, error) {
	if len(raw) == 0 {
		return Identity{Type: identityMatchRepoDigestOrExact}, nil
	}
	var id struct {
		Type             string `json:"type"`
		DockerReference  string `json:"dockerReference"`
		DockerRepository string `json:"dockerRepository"`
		Prefix           string `json:"prefix"`
		SignedPrefix     string `json:"signedPrefix"`
	}
	if err := strict(raw, &id); err != nil {
		return Identity{}, err
	}
	out := Identity{Type: id.Type, DockerReference: id.DockerReference, DockerRepository: id.DockerRepository, Prefix: id.Prefix, SignedPrefix: id.SignedPrefix}
	extra := func(fields ...string) error {
		for _, f := range fields {
			if f != "" {
				return fmt.Errorf("%s takes no field %q", id.Type, f)
			}
		}
		return nil
	}
	switch id.Type {
	case identityMatchExact, identityMatchRepoDigestOrExact, identityMatchRepository:
		if id.DockerReference != "" || id.DockerRepository != "" || id.Prefix != "" || id.SignedPrefix != "" {
			return Identity{}, fmt.Errorf("%s takes no other field", id.Type)
		}
	case identityExactReference:
		if err := extra(id.DockerRepository, id.Prefix, id.SignedPrefix); err != nil {
			return Identity{}, err
		}
		n, err := image.ParseName(id.DockerReference)
		if err != nil || (n.Tag == "" && n.Digest == "") || (n.Tag != "" && n.Digest != "") {
			return Identity{}, fmt.Errorf("%s: dockerReference %q must be a full repo:tag or repo@digest", id.Type, id.DockerReference)
		}
		out.DockerReference = n.String()
	case identityExactRepository:
		if err := extra(id.DockerReference, id.Prefix, id.SignedPrefix); err != nil {
			return Identity{}, err
		}
		n, err := image.ParseName(id.DockerRepository)
		if err != nil || n.Tag != "" || n.Digest != "" {
			return Identity{}, fmt.Errorf("%s: dockerRepository %q must be a repository without tag or digest", id.Type, id.DockerRepository)
		}
		out.DockerRepository = n.Repo()
	case identityRemapIdentity:
		if err := extra(id.DockerReference, id.DockerRepository); err != nil {
			return Identity{}, err
		}
		for _, p := range []string{id.Prefix, id.SignedPrefix} {
			if err := validatePrefix(p); err != nil {
				return Identity{}, fmt.Errorf("%s: %w", id.Type, err)
			}
		}
	case "":
		return Identity{}, fmt.Errorf(`"type" is required`)
	default:
		return Identity{}, fmt.Errorf("unknown type %q", id.Type)
	}
	return out, nil
}

var (
	wildcardScope = regexp.MustCompile(`^\*\.[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*$`)
	hostPattern   = regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?$`)
)

// validatePrefix accepts host[:port][/path…] in the fully expanded form.
func validatePrefix(p string) error {
	host, rest, _ := strings.Cut(p, "/")
	if !hostPattern.MatchString(host) {
		return fmt.Errorf("%q is not host[:port][/namespace…] in the fully expanded form (docker.io/library/busybox, not busybox)", p)
	}
	if rest == "" {
		if strings.Contains(p, "/") {
			return fmt.Errorf("%q ends in /", p)
		}
		return nil
	}
	n, err := image.ParseName(p)
	if err != nil || n.Tag != "" || n.Digest != "" || n.Repo() != p {
		return fmt.Errorf("%q is not a repository or namespace in the fully expanded form (docker.io/library/busybox, not busybox)", p)
	}
	return nil
}

// validateScope accepts the docker transport's scopes: a wildcard domain,
// a host, a namespace, a repository, or one image (repo:tag, repo@digest),
// each in the fully expanded form.
func validateScope(scope string) error {
	if strings.Contains(scope, "*") {
		if !wildcardScope.MatchString(scope) {
			return fmt.Errorf("a wildcard scope is *.domain (like *.example.com)")
		}
		return nil
	}
	last := scope[strings.LastIndex(scope, "/")+1:]
	if strings.Contains(scope, "/") && (strings.Contains(last, ":") || strings.Contains(scope, "@")) {
		n, err := image.ParseName(scope)
		if err != nil || n.String() != scope || (n.Tag != "" && n.Digest != "") {
			return fmt.Errorf("an image scope is repo:tag or repo@digest in the fully expanded form (docker.io/library/busybox:latest, not busybox:latest)")
		}
		return nil
	}
	return validatePrefix(scope)
}

// Scope is the scope that applies to an image and its requirements.
type Scope struct {
	// Name is `docker "<scope>"`, `docker ""` or `default`.
	Name         string
	Requirements []Requirement
}

// Match finds the most specific scope for ref (a zero ref, an unnamed
// image, gets the defaults): the image itself (repo@digest, then
// repo:tag), its repository, each parent namespace, the registry host,
// wildcard domains of the host from the longest, then the docker
// transport's default "", then "default".
func (p *Policy) Match(ref image.Named) Scope {
	if ref.Path != "" {
		for _, c := range candidates(ref) {
			if reqs, ok := p.scopes[c]; ok {
				return Scope{Name: fmt.Sprintf("docker %q", c), Requirements: reqs}
			}
		}
	}
	if p.transportDefault != nil {
		return Scope{Name: `docker ""`, Requirements: p.transportDefault}
	}
	return Scope{Name: "default", Requirements: p.global}
}

func candidates(ref image.Named) []string {
	var out []string
	if ref.Digest != "" {
		out = append(out, ref.Repo()+"@"+ref.Digest)
	}
	if ref.Tag != "" {
		out = append(out, ref.Repo()+":"+ref.Tag)
	}
	name := ref.Repo()
	out = append(out, name)
	for {
		i := strings.LastIndex(name, "/")
		if i < 0 {
			break
		}
		name = name[:i]
		out = append(out, name)
	}
	// name is the host now; wildcards never carry a port.
	if i := strings.LastIndex(name, ":"); i >= 0 && !strings.HasSuffix(name, "]") {
		name = name[:i]
	}
	for {
		i := strings.Index(name, ".")
		if i < 0 {
			break
		}
		name = name[i+1:]
		out = append(out, "*."+name)
	}
	return out
}

// Scopes lists the policy's scope names, sorted (for logs).
func (p *Policy) Scopes() []string {
	out := make([]string, 0, len(p.scopes))
	for s := range p.scopes {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}
