// Package idprefix resolves the IDs crictl users type: a full ID or any
// prefix that names exactly one object. One behaviour for containers,
// sandboxes and images: an ID that names nothing is errdefs.ErrNotFound
// (what containerd answers and crictl expects), a prefix that names
// several objects is errdefs.ErrInvalidArgument (the request does not say
// which one it means, and retrying it cannot help).
package idprefix

import (
	"fmt"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
)

// Resolve returns m[id] or, failing that, the value of the only key that
// starts with id. kind names the object in errors ("container"). key, if
// not nil, turns a map key into the form prefixes are matched against
// (images strip "sha256:").
func Resolve[V any](m map[string]V, kind, id string, key func(string) string) (V, error) {
	var zero V
	if id == "" {
		return zero, fmt.Errorf("empty %s ID: %w", kind, errdefs.ErrNotFound)
	}
	if v, ok := m[id]; ok {
		return v, nil
	}
	var found V
	matches := 0
	for k, v := range m {
		if key != nil {
			k = key(k)
		}
		if strings.HasPrefix(k, id) {
			if matches++; matches > 1 {
				return zero, fmt.Errorf("%s ID prefix %q matches more than one %s: %w", kind, id, kind, errdefs.ErrInvalidArgument)
			}
			found = v
		}
	}
	if matches == 0 {
		return zero, fmt.Errorf("%s %q: %w", kind, id, errdefs.ErrNotFound)
	}
	return found, nil
}
