package container

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestReplaceMaskedSymlinks(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"bin", "usr/lib/dir", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), []byte("bb"), 0o755); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"bin/ls":          "busybox", // relative, to a file
		"usr/lib/linkdir": "dir",     // to a directory
		"lib":             "usr/lib", // a link in the parent of a masked path
		"bin/abs":         "/bin/busybox",
		"bin/dangling":    "nowhere",
		"proc/kcore":      "../bin/ls", // under a mount: not the rootfs's business
	}
	for p, target := range links {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	masked := []string{"/bin/ls", "/lib/linkdir", "/bin/abs", "/bin/dangling", "/proc/kcore", "/bin/busybox", "/not/there"}
	mounts := []specs.Mount{{Destination: "/proc", Type: "proc"}}
	if err := replaceMaskedSymlinks(root, masked, mounts); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		"bin/ls": 0, "usr/lib/linkdir": os.ModeDir, "bin/abs": 0, "bin/dangling": 0,
		"proc/kcore": os.ModeSymlink, "lib": os.ModeSymlink,
	} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if fi.Mode().Type() != want {
			t.Errorf("%s: type %v, want %v", p, fi.Mode().Type(), want)
		}
		if want == 0 && fi.Size() != 0 {
			t.Errorf("%s: %d bytes, want an empty file", p, fi.Size())
		}
	}
	// The link's target is untouched.
	if data, err := os.ReadFile(filepath.Join(root, "bin/busybox")); err != nil || string(data) != "bb" {
		t.Fatalf("busybox: %q, %v", data, err)
	}
}

// An image's /dev that is a symlink (CVE-2026-41579) becomes an empty
// directory; its target, on the host here, is left alone. A real /dev and
// a rootfs without one are untouched.
func TestReplaceDevSymlink(t *testing.T) {
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "ptmx"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, setup := range map[string]func(root string) error{
		"absolute link": func(root string) error { return os.Symlink(host, filepath.Join(root, "dev")) },
		"relative link": func(root string) error { return os.Symlink("../../../../../.."+host, filepath.Join(root, "dev")) },
		"directory": func(root string) error {
			if err := os.Mkdir(filepath.Join(root, "dev"), 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(root, "dev", "keep"), nil, 0o644)
		},
		"none": func(string) error { return nil },
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := setup(root); err != nil {
				t.Fatal(err)
			}
			if err := replaceDevSymlink(root); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(filepath.Join(root, "dev"))
			switch {
			case name == "none":
				if !os.IsNotExist(err) {
					t.Fatalf("dev created: %v %v", fi, err)
				}
			case err != nil || !fi.IsDir():
				t.Fatalf("dev: %v %v, want a directory", fi, err)
			case name == "directory":
				if _, err := os.Stat(filepath.Join(root, "dev", "keep")); err != nil {
					t.Fatalf("a real /dev was replaced: %v", err)
				}
			}
			if data, err := os.ReadFile(filepath.Join(host, "ptmx")); err != nil || string(data) != "host" {
				t.Fatalf("host ptmx: %q %v", data, err)
			}
		})
	}
}
