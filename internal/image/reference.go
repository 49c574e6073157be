package image

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
)

// Docker Hub spellings: "busybox" means docker.io/library/busybox:latest.
const (
	dockerHub       = "docker.io"
	dockerHubLegacy = "index.docker.io"
	dockerHubAPI    = "registry-1.docker.io" // where docker.io's API lives
	officialRepo    = "library/"
	defaultTag      = "latest"
)

var (
	pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	tagPattern    = regexp.MustCompile(`^[\w][\w.-]{0,127}$`)
	digestPattern = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	hexPattern    = regexp.MustCompile(`^[a-f0-9]{1,64}$`)
	domainPattern = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$`)
)

// Named is a parsed, normalized image reference.
type Named struct {
	Domain string // registry host[:port], "docker.io" for Docker Hub
	Path   string // repository path inside the registry, "library/busybox"
	Tag    string // "" when Digest is set and no tag was given
	Digest string // "sha256:<hex>" or ""
}

// Repo is domain/path, the name part of RepoTags and RepoDigests.
func (n Named) Repo() string { return n.Domain + "/" + n.Path }

// String is the canonical form: repo:tag, repo@digest or repo:tag@digest.
func (n Named) String() string {
	s := n.Repo()
	if n.Tag != "" {
		s += ":" + n.Tag
	}
	if n.Digest != "" {
		s += "@" + n.Digest
	}
	return s
}

// TagRef is repo:tag ("" without a tag).
func (n Named) TagRef() string {
	if n.Tag == "" {
		return ""
	}
	return n.Repo() + ":" + n.Tag
}

// ParseReference normalizes an image reference the way containerd and
// Docker do: a missing registry is docker.io, a one-component Hub name gets
// library/, a missing tag and digest means :latest.
func ParseReference(ref string) (Named, error) {
	return parseReference(ref, true)
}

// ParseName normalizes a reference like ParseReference but adds no tag:
// "example.com/app" stays a bare repository (Tag and Digest empty), as
// signature identities and policy scopes name them.
func ParseName(ref string) (Named, error) {
	return parseReference(ref, false)
}

func parseReference(ref string, withDefaultTag bool) (Named, error) {
	var n Named
	orig := ref
	if ref == "" {
		return n, fmt.Errorf("empty image reference: %w", errdefs.ErrInvalidArgument)
	}
	if i := strings.Index(ref, "@"); i >= 0 {
		n.Digest = ref[i+1:]
		ref = ref[:i]
		if !digestPattern.MatchString(n.Digest) {
			return n, fmt.Errorf("image reference %q: bad digest %q: %w", orig, n.Digest, errdefs.ErrInvalidArgument)
		}
	}
	if i := strings.LastIndex(ref, ":"); i >= 0 && !strings.Contains(ref[i+1:], "/") {
		n.Tag = ref[i+1:]
		ref = ref[:i]
		if !tagPattern.MatchString(n.Tag) {
			return n, fmt.Errorf("image reference %q: bad tag %q: %w", orig, n.Tag, errdefs.ErrInvalidArgument)
		}
	}
	first, rest, found := strings.Cut(ref, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		n.Domain, n.Path = first, rest
	} else {
		n.Domain, n.Path = dockerHub, ref
	}
	if n.Domain == dockerHubLegacy {
		n.Domain = dockerHub
	}
	if n.Domain == dockerHub && !strings.Contains(n.Path, "/") {
		n.Path = officialRepo + n.Path
	}
	if !domainPattern.MatchString(n.Domain) {
		return n, fmt.Errorf("image reference %q: bad registry host %q: %w", orig, n.Domain, errdefs.ErrInvalidArgument)
	}
	if n.Path == "" {
		return n, fmt.Errorf("image reference %q: no repository: %w", orig, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(n.Path, "/") {
		if !pathComponent.MatchString(c) {
			return n, fmt.Errorf("image reference %q: bad repository component %q: %w", orig, c, errdefs.ErrInvalidArgument)
		}
	}
	if withDefaultTag && n.Tag == "" && n.Digest == "" {
		n.Tag = defaultTag
	}
	return n, nil
}
