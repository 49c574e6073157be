package diskusage

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWalkCountsHardLinksOnceAndSkips(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 64<<10)
	if err := os.WriteFile(filepath.Join(dir, "a"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "skipped"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "skipped", "c"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := Walk(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	// dir, a (= b), skipped, skipped/c
	if all.Inodes != 4 || all.Bytes < 2*uint64(len(data)) {
		t.Fatalf("whole tree: %+v", all)
	}
	part, err := Walk(dir, func(p string) bool { return p == filepath.Join(dir, "skipped") })
	if err != nil {
		t.Fatal(err)
	}
	if part.Inodes != 2 || part.Bytes >= all.Bytes {
		t.Fatalf("with skip: %+v (whole %+v)", part, all)
	}
	if _, err := Walk(filepath.Join(dir, "missing"), nil); err != nil {
		t.Fatalf("a missing tree is empty, not an error: %v", err)
	}
}
