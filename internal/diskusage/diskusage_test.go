package diskusage

import (
	"fmt"
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

// TestWalkRemembersOnlyLinkedFilesAndBoundsThem: a tree of many single
// files (what a container can make in its writable layer) makes the walk
// remember nothing, and hard links past the bound are still counted once
// (issue 34, finding 11).
func TestWalkRemembersOnlyLinkedFilesAndBoundsThem(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 8<<10)
	for i := range 200 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	single, remembered, err := walk(dir, nil, maxLinked)
	if err != nil || remembered != 0 || single.Inodes != 201 {
		t.Fatalf("200 single files: %+v, %d remembered, %v", single, remembered, err)
	}
	for i := range 6 {
		p := filepath.Join(dir, fmt.Sprintf("l%d", i))
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		for j := range i % 3 {
			if err := os.Link(p, fmt.Sprintf("%s.%d", p, j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	exact, _, err := walk(dir, nil, maxLinked)
	if err != nil || exact.Inodes != 207 {
		t.Fatalf("with links: %+v, %v", exact, err)
	}
	for _, limit := range []int{0, 1, 2} {
		got, remembered, err := walk(dir, nil, limit)
		if err != nil || remembered > limit || got != exact {
			t.Errorf("limit %d: %+v with %d remembered, want %+v (%v)", limit, got, remembered, exact, err)
		}
	}
}
