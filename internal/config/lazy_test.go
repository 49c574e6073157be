package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// image_lazy_pull.background_fetch_quiet: 2 s by default, read from the
// file, and refused outside [0, 30 s].
func TestLazyBackgroundFetchQuiet(t *testing.T) {
	if got := time.Duration(Default().ImageLazyPull.BackgroundFetchQuiet); got != 2*time.Second {
		t.Fatalf("default %v, want 2s", got)
	}
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{`"0s"`, true}, {`"500ms"`, true}, {`"30s"`, true},
		{`"-1s"`, false}, {`"31s"`, false}, {`"1h"`, false},
	} {
		path := filepath.Join(t.TempDir(), "berth.toml")
		if err := os.WriteFile(path, []byte("[image_lazy_pull]\nbackground_fetch_quiet = "+tc.value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := Default()
		err := LoadFile(cfg, path)
		if err == nil {
			err = cfg.Validate()
		}
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "background_fetch_quiet")) {
			t.Errorf("background_fetch_quiet = %s: %v, want ok %v", tc.value, err, tc.ok)
		}
	}
}
