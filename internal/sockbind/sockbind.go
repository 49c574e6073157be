// Package sockbind binds root's unix sockets (the CRI socket, lazy.sock)
// so that none ever exists at its path with a mode wider than asked: bound
// in place, a socket has for a moment the mode the umask gives (0777 under
// umask 0), and a host user connecting then keeps the connection.
// (syscall.Umask would do too, but it is process-wide and goroutines run.)
package sockbind

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// bindPrefix starts the name of the private directory a socket is bound
// in, beside its path.
const bindPrefix = ".bind-"

// PrivateDir is the directory, beside path, that Listen binds path's
// socket in: one name per socket, so that a daemon killed between bind
// and rename leaves one its next start removes, and daemons binding other
// sockets in the same directory never touch each other's.
func PrivateDir(path string) string {
	return filepath.Join(filepath.Dir(path), bindPrefix+filepath.Base(path))
}

// Listen listens on a unix socket at path with mode, replacing a socket
// a previous daemon left there and the private directory it may have
// left (PrivateDir): the caller must own path (berthd holds its root
// lock). The socket is bound in a new 0700 PrivateDir, chmodded there and
// only then renamed into place; the directory is removed before Listen
// returns. Close does not unlink the socket: the caller removes path.
func Listen(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	private := PrivateDir(path)
	if err := removeStale(private); err != nil {
		return nil, err
	}
	if err := os.Mkdir(private, 0o700); err != nil {
		return nil, fmt.Errorf("create a private dir to bind %s: %w", path, err)
	}
	defer os.RemoveAll(private)
	bound := filepath.Join(private, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Close must not unlink by the bound name, gone after the rename.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(bound, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	if err := os.Rename(bound, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("move socket into place at %s: %w", path, err)
	}
	return ln, nil
}

// removeStale removes what a daemon killed between bind and rename left
// at private, and the private directories of berthds before PrivateDir
// (os.MkdirTemp's ".bind-" and digits) beside it. A symbolic link is
// removed, never followed: RemoveAll removes a link as it is and opens
// what it descends into with O_NOFOLLOW; ReadDir's types are lstat's.
func removeStale(private string) error {
	if err := os.RemoveAll(private); err != nil {
		return fmt.Errorf("remove the stale private dir %s: %w", private, err)
	}
	dir := filepath.Dir(private)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("look for stale private dirs in %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.IsDir() || !legacyName(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove the stale private dir %s: %w", filepath.Join(dir, e.Name()), err)
		}
	}
	return nil
}

// legacyName: os.MkdirTemp(dir, ".bind-")'s names, as berthds bound
// their sockets before PrivateDir.
func legacyName(name string) bool {
	digits, ok := strings.CutPrefix(name, bindPrefix)
	if !ok || digits == "" {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
