package sigpolicy

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A policy file and its key files are bounded before they are read: a
// larger file, a FIFO (which would block berthd's start or reload) and a
// device (/dev/zero, which never ends) are refused with a clear error.
func TestLoadRefusesHostileFiles(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, []byte(`{"default": [{"type": "reject"}]}`+strings.Repeat(" ", maxPolicySize)), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	keyFifo := filepath.Join(dir, "key.fifo")
	if err := syscall.Mkfifo(keyFifo, 0o600); err != nil {
		t.Fatal(err)
	}
	bigKey := filepath.Join(dir, "big.pub")
	if err := os.WriteFile(bigKey, make([]byte, maxKeyFileSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	withKey := func(file, key string) string {
		p := filepath.Join(dir, file)
		doc := `{"default": [{"type": "sigstoreSigned", "keyPath": "` + key + `"}]}`
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ path, want string }{
		{big, "larger than"},
		{fifo, "not a regular file"},
		{withKey("zero.json", "/dev/zero"), "not a regular file"},
		{withKey("keyfifo.json", keyFifo), "not a regular file"},
		{withKey("bigkey.json", bigKey), "larger than"},
	} {
		if _, err := Load(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%s): %v, want an error with %q", filepath.Base(tc.path), err, tc.want)
		}
	}
}
