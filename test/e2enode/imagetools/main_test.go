package main

import (
	"testing"
	"time"
)

func TestExpand(t *testing.T) {
	now := time.Date(2026, 11, 26, 5, 7, 9, 123456789, time.UTC)
	for format, want := range map[string]string{
		"%3t":     "05:07:09.123",
		"%t":      "05:07:09",
		"at %6t!": "at 05:07:09.123456!",
		"100%":    "100%",
		"%x":      "%x",
	} {
		if got := expand(format, now); got != want {
			t.Errorf("expand(%q) = %q, want %q", format, got, want)
		}
	}
}
