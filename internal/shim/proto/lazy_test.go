package proto

import (
	"strings"
	"testing"
)

func TestLazyLayerNamesChecked(t *testing.T) {
	hex := strings.Repeat("0a", 32)
	for _, tc := range []struct {
		id, dir string
		ok      bool
	}{
		{"sha256:" + hex, "/var/lib/berth/images/layers/" + hex, true},
		{"sha256:" + strings.ToUpper(hex), "/l", false},
		{"sha512:" + hex, "/l", false},
		{"sha256:" + hex[:63], "/l", false},
		{"sha256:" + hex + "0", "/l", false},
		{hex, "/l", false},
		{"sha256:" + hex[:62] + "/.", "/l", false},
		{"sha256:" + hex, "l", false},
		{"sha256:" + hex, "/l/", false},
		{"sha256:" + hex, "/l/../m", false},
		{"sha256:" + hex, "/", false},
		{"sha256:" + hex, "", false},
		{"sha256:" + hex, "/" + strings.Repeat("x", maxLayerDir), false},
	} {
		err := CheckChainID(tc.id)
		if err == nil {
			err = CheckLayerDir(tc.dir)
		}
		if (err == nil) != tc.ok {
			t.Errorf("%q, %.40q: %v, want ok %v", tc.id, tc.dir, err, tc.ok)
		}
	}
}
