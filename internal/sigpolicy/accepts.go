package sigpolicy

import "github.com/berthcri/berth/internal/image"

// AcceptsUnsigned reports whether the scope that applies to ref accepts
// an image with no signature: it requires nothing but
// insecureAcceptAnything. No policy (nil) accepts everything. berthctl
// doctor asks it of the registries that have mirrors: a mirror is a
// second party that can serve any bytes under the registry's name, and
// only a signature ties them to their publisher.
func (p *Policy) AcceptsUnsigned(ref image.Named) bool {
	if p == nil {
		return true
	}
	for _, r := range p.Match(ref).Requirements {
		if r.Type != TypeInsecureAcceptAnything {
			return false
		}
	}
	return true
}

// ScopeOf names the scope that applies to ref (for messages).
func (p *Policy) ScopeOf(ref image.Named) string {
	if p == nil {
		return "no policy"
	}
	return p.Match(ref).Name
}
