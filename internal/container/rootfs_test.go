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
