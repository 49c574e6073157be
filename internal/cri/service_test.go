package cri

import (
	"strings"
	"testing"
)

// New refuses to build a service with a component missing, naming each,
// rather than building a stand-in (a lifecycle without NRI's hooks, a
// configuration other than the live one).
func TestNewRefusesMissingComponents(t *testing.T) {
	s, err := New(Options{Version: "test"})
	if err == nil || s != nil {
		t.Fatalf("New without components = %v, %v; want an error", s, err)
	}
	for _, name := range []string{"Cgroups", "Containers", "Events", "Host", "Images", "Lifecycle", "Live", "Logger", "Network", "Sandboxes", "Stats", "Streaming"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}
