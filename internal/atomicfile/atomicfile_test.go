package atomicfile

import (
	"fmt"
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

func TestDeferredWriteIsVisibleAtOnceAndFlushes(t *testing.T) {
	var failed []string
	d := NewDeferred(func(path string, err error) { failed = append(failed, path+": "+err.Error()) })
	dir := t.TempDir()
	for i, content := range []string{"first", "second, longer than the first"} {
		path := filepath.Join(dir, "record.json")
		if err := d.Write(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		// Readable at once, before any fsync.
		if got, err := os.ReadFile(path); err != nil || string(got) != content {
			t.Fatalf("write %d: read back %q, %v; want %q", i, got, err, content)
		}
	}
	// A file removed before its fsync ran needs none.
	gone := filepath.Join(dir, "gone.json")
	if err := d.Write(gone, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(gone)
	d.Flush()
	d.mu.Lock()
	pending, running := len(d.pending), d.running
	d.mu.Unlock()
	if pending != 0 || running {
		t.Errorf("after Flush: %d pending, running %v", pending, running)
	}
	if len(failed) > 0 {
		t.Errorf("background fsyncs failed: %v", failed)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("dir holds %d entries, want only the record: %v", len(entries), entries)
	}
}

func TestNilDeferredWritesSynchronously(t *testing.T) {
	var d *Deferred
	path := filepath.Join(t.TempDir(), "f")
	if err := d.Write(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Flush()
	if got, err := os.ReadFile(path); err != nil || string(got) != "x" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if err := d.Write(filepath.Join(t.TempDir(), "missing", "f"), []byte("x"), 0o644); err == nil {
		t.Fatal("write into a missing dir succeeded")
	}
}

func TestDeferredFlushWaitsForConcurrentWriters(t *testing.T) {
	d := NewDeferred(nil)
	dir := t.TempDir()
	done := make(chan struct{})
	for w := 0; w < 4; w++ {
		go func(w int) {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 25; i++ {
				if err := d.Write(filepath.Join(dir, fmt.Sprintf("w%d-%d", w, i)), []byte("x"), 0o600); err != nil {
					t.Error(err)
					return
				}
			}
		}(w)
	}
	for w := 0; w < 4; w++ {
		<-done
	}
	d.Flush()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pending) != 0 || d.running {
		t.Errorf("after Flush: %d pending, running %v", len(d.pending), d.running)
	}
}
