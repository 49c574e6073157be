package monitor

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

// TestOpenLogFileFollowsNoLinkBelowTheLogDir plants what a container with
// write access to the pod's log directory could plant, and checks that the
// log file is never opened through it (issue 34, finding 6).
func TestOpenLogFileFollowsNoLinkBelowTheLogDir(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir, outside string)
		rel   string
		ok    bool
	}{
		{"plain, dirs made", func(*testing.T, string, string) {}, "c/0.log", true},
		{"existing file", func(t *testing.T, dir, _ string) { write(t, filepath.Join(dir, "0.log"), "old\n") }, "0.log", true},
		{"file symlink", func(t *testing.T, dir, outside string) {
			mkdir(t, filepath.Join(dir, "c"))
			symlink(t, filepath.Join(outside, "host"), filepath.Join(dir, "c", "0.log"))
		}, "c/0.log", false},
		{"dangling file symlink", func(t *testing.T, dir, outside string) {
			symlink(t, filepath.Join(outside, "new"), filepath.Join(dir, "0.log"))
		}, "0.log", false},
		{"dir symlink", func(t *testing.T, dir, outside string) { symlink(t, outside, filepath.Join(dir, "c")) }, "c/host", false},
		{"relative dir symlink", func(t *testing.T, dir, _ string) {
			mkdir(t, filepath.Join(dir, "real"))
			symlink(t, "real", filepath.Join(dir, "c"))
		}, "c/0.log", false},
		{"hard link", func(t *testing.T, dir, outside string) {
			if err := os.Link(filepath.Join(outside, "host"), filepath.Join(dir, "0.log")); err != nil {
				t.Fatal(err)
			}
		}, "0.log", false},
		{"fifo", func(t *testing.T, dir, _ string) {
			if err := unix.Mkfifo(filepath.Join(dir, "0.log"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "0.log", false},
		{"directory", func(t *testing.T, dir, _ string) { mkdir(t, filepath.Join(dir, "0.log")) }, "0.log", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir, outside := filepath.Join(base, "pods", "p"), filepath.Join(base, "outside")
			mkdir(t, dir)
			mkdir(t, outside)
			write(t, filepath.Join(outside, "host"), "precious\n")
			tc.plant(t, dir, outside)
			f, err := openLogFile(dir, filepath.Join(dir, tc.rel))
			if tc.ok {
				if err != nil {
					t.Fatalf("openLogFile: %v", err)
				}
				defer f.Close()
				if _, err := f.WriteString("x\n"); err != nil {
					t.Fatal(err)
				}
				fi, err := os.Lstat(filepath.Join(dir, tc.rel))
				if err != nil || !fi.Mode().IsRegular() {
					t.Fatalf("log file: %v, %v", fi, err)
				}
			} else if err == nil {
				f.Close()
				t.Fatalf("openLogFile opened %s through a planted link", tc.rel)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "host")); string(b) != "precious\n" {
				t.Fatalf("host file now %q", b)
			}
			if _, err := os.Lstat(filepath.Join(outside, "new")); err == nil {
				t.Fatal("a file was created outside the log directory")
			}
		})
	}
}

func TestOpenLogFileRefusesPathsOutsideItsDir(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ dir, path string }{
		{dir, filepath.Join(filepath.Dir(dir), "x.log")},
		{dir, dir},
		{dir + "/../" + filepath.Base(dir), filepath.Join(dir, "x.log")},
		{"relative", "relative/x.log"},
	} {
		if f, err := openLogFile(tc.dir, tc.path); !errors.Is(err, errdefs.ErrInvalidArgument) {
			if f != nil {
				f.Close()
			}
			t.Errorf("openLogFile(%q, %q): %v, want InvalidArgument", tc.dir, tc.path, err)
		}
	}
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}
