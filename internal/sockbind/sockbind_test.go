package sockbind

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestListenRemovesStalePrivateDirs: what a daemon killed between bind
// and rename left (its socket's private dir, or a berthd's before
// PrivateDir: ".bind-" and digits) is removed at the next Listen; another
// socket's private dir, names not of that form, and what a symbolic link
// at either name points to are left alone.
func TestListenRemovesStalePrivateDirs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.sock")
	outside := t.TempDir()
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	staleSocket := func(d string) {
		t.Helper()
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(d, "s"), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
	}
	staleSocket(PrivateDir(path))                   // this socket's
	staleSocket(filepath.Join(dir, ".bind-12345"))  // a berthd's before PrivateDir
	staleSocket(filepath.Join(dir, ".bind-y.sock")) // another socket's: kept
	staleSocket(filepath.Join(dir, ".bind-12a"))    // not os.MkdirTemp's: kept
	if err := os.Symlink(outside, filepath.Join(dir, ".bind-777")); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st, err := os.Lstat(path)
	if err != nil || st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v, want a socket 0600", path, st, err)
	}
	for name, want := range map[string]bool{
		".bind-x.sock": false, ".bind-12345": false,
		".bind-y.sock": true, ".bind-12a": true, ".bind-777": true,
	} {
		_, err := os.Lstat(filepath.Join(dir, name))
		if got := err == nil; got != want {
			t.Errorf("%s: there %v, want %v (%v)", name, got, want, err)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a link's target: %v", err)
	}

	// A symbolic link at the socket's own private dir's name is removed,
	// not followed.
	ln.Close()
	if err := os.Symlink(outside, PrivateDir(path)); err != nil {
		t.Fatal(err)
	}
	ln2, err := Listen(path, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("the link's target: %v", err)
	}
	if _, err := os.Lstat(PrivateDir(path)); !os.IsNotExist(err) {
		t.Errorf("%s left: %v", PrivateDir(path), err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o660 {
		t.Errorf("%s: %v %v, want 0660", path, st, err)
	}
}
