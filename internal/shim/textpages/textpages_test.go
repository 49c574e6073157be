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
	if self, err := os.ReadFile("/proc/self/exe"); err == nil && !fixedAddress(self[:18]) {
		if nrange != 0 {
			t.Fatal("a position-independent binary's mappings were taken for release")
		}
		t.Skip("the test binary is position-independent: nothing is released")
	}
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

// Only a binary linked at a fixed address is released: a PIE's RELRO
// mapping is read-only but holds the loader's relocations.
func TestFixedAddressOnlyForExecutables(t *testing.T) {
	hdr := func(etype byte) []byte {
		h := make([]byte, 18)
		copy(h, "\x7fELF")
		h[4], h[5], h[16] = 2, 1, etype
		return h
	}
	for _, c := range []struct {
		name string
		hdr  []byte
		want bool
	}{
		{"ET_EXEC", hdr(2), true},
		{"ET_DYN (PIE)", hdr(3), false},
		{"short", hdr(2)[:10], false},
		{"not ELF", make([]byte, 18), false},
	} {
		if got := fixedAddress(c.hdr); got != c.want {
			t.Errorf("%s: fixedAddress = %v, want %v", c.name, got, c.want)
		}
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if !fixedAddress(self[:18]) {
		t.Skip("the test binary is position-independent: nothing to release")
	}
}
