package config

import (
	"strings"
	"testing"
)

func TestByteSizeRoundTrip(t *testing.T) {
	for _, c := range []struct {
		in   string
		want ByteSize
	}{{"32MiB", 32 << 20}, {"64mb", 64 << 20}, {"1GiB", 1 << 30}, {"1000", 1000}, {"4KiB", 4096}} {
		var b ByteSize
		if err := b.UnmarshalText([]byte(c.in)); err != nil || b != c.want {
			t.Fatalf("UnmarshalText(%q) = %d, %v; want %d", c.in, b, err, c.want)
		}
		out, _ := b.MarshalText()
		var back ByteSize
		if err := back.UnmarshalText(out); err != nil || back != b {
			t.Fatalf("%d → %q → %d, %v", b, out, back, err)
		}
	}
}

func TestImageRangeFetchValidation(t *testing.T) {
	cfg := Default()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.ImageRangeFetch.Parallel = 0
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "parallel") {
		t.Fatalf("parallel 0: %v", err)
	}
	cfg.ImageRangeFetch.Enable = false
	if err := cfg.Validate(); err != nil {
		t.Fatalf("disabled: %v", err)
	}
}

func TestImageLimitsDefaultsAndValidation(t *testing.T) {
	cfg := Default()
	if cfg.ImageLimits.MaxLayerSize != 32<<30 || cfg.ImageLimits.MaxImageSize != 64<<30 ||
		cfg.ImageLimits.MaxLayerEntries != 1<<22 || cfg.ImageLimits.MaxLayerDirs != 1<<20 {
		t.Fatalf("defaults: %+v", cfg.ImageLimits)
	}
	out, err := cfg.TOML()
	if err != nil || !strings.Contains(string(out), `max_layer_size = "32GiB"`) {
		t.Fatalf("TOML: %v\n%s", err, out)
	}
	cfg.ImageLimits.MaxLayerSize = 0 // off
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.ImageLimits.MaxLayerDirs = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "image_limits") {
		t.Fatalf("negative limit: %v", err)
	}
}
