// Package atomicfile writes small state files (records, checkpoints,
// exit statuses) so that a crash leaves either the old or the new file,
// never a torn one, and the new one survives a power loss once Write
// returns.
//
// Deferred writes the same way but leaves the fsyncs to a goroutine of its
// own, for the few files whose recovery does not need them before the
// caller goes on (decision 1600).
//
// It imports only low-level standard packages (os, path/filepath, sync):
// berth-shim links it, and the shim's memory budget (docs/decisions/0303)
// keeps its dependencies few; the shim uses only Write.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to a temp file in path's directory, fsyncs it,
// renames it over path and fsyncs the directory so the rename itself is
// durable. The file gets perm (before umask). Errors name path.
func Write(path string, data []byte, perm os.FileMode) error {
	if err := replace(path, data, perm, true); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// replace writes data to a temp file in path's directory (fsynced when
// sync is set) and renames it over path.
func replace(path string, data []byte, perm os.FileMode, sync bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return &os.PathError{Op: "create temp for", Path: path, Err: err}
	}
	name := tmp.Name()
	committed := false
	defer func() {
		if !committed {
			os.Remove(name)
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	if sync {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return &os.PathError{Op: "sync", Path: path, Err: err}
		}
	}
	if err := tmp.Close(); err != nil {
		return &os.PathError{Op: "close", Path: path, Err: err}
	}
	if err := os.Rename(name, path); err != nil {
		return err
	}
	committed = true
	return nil
}

// SyncDir fsyncs a directory, making renames and creations in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "sync dir", Path: dir, Err: err}
	}
	return nil
}
