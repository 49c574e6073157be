package textpages

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Release drops the binary's read-only pages from the process and nothing
// else: the program runs on (its code and constants fault back in), its
// written data keeps what was written, and Release allocates nothing, as
// the monitor's housekeeping must not (decision 1700).
func TestReleaseKeepsTheProcessWhole(t *testing.T) {
	Find()
	if nrange == 0 {
		t.Fatal("no read-only mapping of the test binary found in /proc/self/maps")
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], "rw") {
			continue
		}
		lo, _, _ := strings.Cut(f[0], "-")
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			t.Fatalf("maps line %q: %v", line, err)
		}
		for _, r := range ranges[:nrange] {
			if uintptr(start) >= r[0] && uintptr(start) < r[1] {
				t.Fatalf("writable mapping %q among the released ranges", line)
			}
		}
	}
	if n := testing.AllocsPerRun(1, find); n != 0 {
		t.Errorf("finding the mappings allocates %v times, want 0", n)
	}
	written = "changed"
	if n := testing.AllocsPerRun(10, Release); n != 0 {
		t.Errorf("Release allocates %v times a call, want 0", n)
	}
	if written != "changed" || !strings.HasPrefix(strings.Repeat("ab", 3), "aba") {
		t.Fatalf("the process lost state across Release: written=%q", written)
	}
}

// written lives in .data (initialised, writable: a private copy of the
// binary's page once written), which Release must not drop.
var written = "initial"
