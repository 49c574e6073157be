package netns

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthcri/berth/internal/testutil/netnstest"
)

func TestDoRunsInsideTheNamespaceAndComesBack(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	pin := netnstest.New(t)
	self, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	if err := Do(pin, func() error {
		var err error
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == self {
		t.Fatalf("fn ran in the caller's namespace %s", self)
	}
	after, _ := os.Readlink("/proc/thread-self/ns/net")
	if after != self {
		t.Fatalf("caller's thread left in %s, want %s", after, self)
	}
	// The loopback device exists only once it is up; a new namespace has it down.
	if err := Do(pin, func() error {
		// thread-self: /proc/net is the thread group leader's namespace.
		b, err := os.ReadFile("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte("eth0")) {
			t.Errorf("new namespace sees host devices:\n%s", b)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDoRefusesAMissingNamespace(t *testing.T) {
	if err := Do(filepath.Join(t.TempDir(), "absent"), func() error { return nil }); err == nil {
		t.Fatal("Do into a missing pin succeeded")
	}
}
