package idprefix

import (
	"errors"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestResolve(t *testing.T) {
	m := map[string]int{"abc123": 1, "abd456": 2, "ffff": 3}
	for _, tc := range []struct {
		id      string
		want    int
		wantErr error
	}{
		{"abc123", 1, nil},
		{"abc", 1, nil},
		{"f", 3, nil},
		{"ab", 0, errdefs.ErrInvalidArgument},
		{"zzz", 0, errdefs.ErrNotFound},
		{"", 0, errdefs.ErrNotFound},
	} {
		got, err := Resolve(m, "container", tc.id, nil)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Errorf("Resolve(%q): err %v, want %v", tc.id, err, tc.wantErr)
			continue
		}
		if tc.wantErr == nil && got != tc.want {
			t.Errorf("Resolve(%q) = %d, want %d", tc.id, got, tc.want)
		}
	}
}

func TestResolveWithKey(t *testing.T) {
	m := map[string]string{"sha256:aaaa": "a", "sha256:bbbb": "b"}
	got, err := Resolve(m, "image", "bb", func(k string) string { return strings.TrimPrefix(k, "sha256:") })
	if err != nil || got != "b" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := Resolve(m, "image", "sha", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("untrimmed keys: %v, want ambiguous", err)
	}
}
