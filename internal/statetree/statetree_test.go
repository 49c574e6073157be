package statetree

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestTightenOnlyRemovesBits(t *testing.T) {
	for _, c := range []struct {
		name       string
		have, want fs.FileMode
		mode       fs.FileMode
	}{
		{"older berthd's 0711 to Private", 0o711, Private, 0o700},
		{"0755 to Private", 0o755, Private, 0o700},
		{"0755 to Traverse", 0o755, Traverse, 0o711},
		{"an operator's 0700 stays under Traverse", 0o700, Traverse, 0o700},
		{"an operator's 0750 loses only others' and group's extra bits", 0o750, Traverse, 0o710},
		{"already Private", 0o700, Private, 0o700},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "d")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, c.have); err != nil {
				t.Fatal(err)
			}
			if err := Tighten(dir, c.want); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != c.mode {
				t.Fatalf("mode %v %v, want %v", fi.Mode().Perm(), err, c.mode)
			}
		})
	}
	if err := Tighten(filepath.Join(t.TempDir(), "missing"), Private); err != nil {
		t.Fatalf("missing dir: %v", err)
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Tighten(f, Private); err == nil {
		t.Fatal("a file where a dir belongs: no error")
	}
}

func TestMkdirAndOpenToMappedRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := Mkdir(dir, Traverse); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != Traverse {
		t.Fatalf("new dir mode %v", fi.Mode().Perm())
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Mkdir(dir, Traverse); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != Traverse {
		t.Fatalf("existing 0755 dir left %v", fi.Mode().Perm())
	}
	if err := OpenToMappedRoot(dir, 200000); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(dir)
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != MappedRoot || st.Uid != 0 || st.Gid != 200000 {
		t.Fatalf("mapped root's dir: %v %d:%d", fi.Mode().Perm(), st.Uid, st.Gid)
	}
}
