package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "record.json")
	for _, content := range []string{"first", "second, longer than the first"} {
		if err := Write(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read back %q, %v; want %q", got, err, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("dir holds %d entries, want only the file: %v", len(entries), entries)
	}
}

func TestWriteIntoMissingDirFailsCleanly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "f")
	if err := Write(path, []byte("x"), 0o644); err == nil {
		t.Fatal("write into a missing dir succeeded")
	}
}

func TestWriteFailureKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := Write(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory in the way of the rename: the write fails, the old
	// content of a sibling is untouched and no temp file stays.
	blocked := filepath.Join(dir, "blocked")
	if err := os.MkdirAll(filepath.Join(blocked, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(blocked, []byte("new"), 0o644); err == nil {
		t.Fatal("rename over a non-empty directory succeeded")
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("old file changed: %q", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("temp file left behind: %v", entries)
	}
}
