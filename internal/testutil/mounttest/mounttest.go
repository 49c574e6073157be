// Package mounttest reads this process's mount table for tests: which
// mounts a test left, or made, below a directory.
package mounttest

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// FUSEBelow are the FUSE mounts (fuse, fuse.*, fuseblk) strictly below
// dir in this process's mount namespace, in mountinfo's order.
func FUSEBelow(t testing.TB, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		mp := Unescape(f[4])
		if !strings.HasPrefix(mp, dir+"/") {
			continue
		}
		// The optional fields end at "-"; the file system type follows.
		if i := slices.Index(f, "-"); i > 0 && i+1 < len(f) && strings.HasPrefix(f[i+1], "fuse") {
			out = append(out, mp)
		}
	}
	return out
}

// Unescape undoes mountinfo's octal escapes (\040 for a space).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
