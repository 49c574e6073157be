package lifecycle

import (
	"errors"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestContainerLogPath(t *testing.T) {
	for _, tc := range []struct {
		dir, rel, want string
		bad            bool
	}{
		{"/var/log/pods/p", "c/0.log", "/var/log/pods/p/c/0.log", false},
		{"/var/log/pods/p", "c_0.log", "/var/log/pods/p/c_0.log", false},
		{"/var/log/pods/p", "a/../b.log", "/var/log/pods/p/b.log", false},
		{"", "c.log", "", false},
		{"/var/log/pods/p", "", "", false},
		{"/var/log/pods/p", "../q/c.log", "", true},
		{"/var/log/pods/p", "a/../../c.log", "", true},
		{"/var/log/pods/p", "/etc/passwd", "", true},
		{"/var/log/pods/p", ".", "", true},
		{"relative", "c.log", "", true},
		{"/var/log/pods/p/../../../etc", "c.log", "", true},
		{"/var/log/pods/p/", "c.log", "", true},
	} {
		got, err := containerLogPath(tc.dir, tc.rel)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("(%q, %q): err %v, want InvalidArgument", tc.dir, tc.rel, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("(%q, %q) = %q, %v; want %q", tc.dir, tc.rel, got, err, tc.want)
		}
	}
}
