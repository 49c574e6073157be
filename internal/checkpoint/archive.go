package checkpoint

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

// WriteArchive writes dir as an uncompressed tar (as CRI-O's checkpoint
// archives are) to path: a temp file beside it, renamed into place once
// complete, so a failure leaves nothing at path.
func WriteArchive(path, dir string) (retErr error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("checkpoint archive %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := tarDir(f, dir); err != nil {
		return fmt.Errorf("checkpoint archive %s: %w", path, err)
	}
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("checkpoint archive %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("checkpoint archive %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("checkpoint archive %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("checkpoint archive %s: %w", path, err)
	}
	return nil
}

// tarDir writes the tree under dir to w, names relative to dir.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		_, err = addEntry(tw, p, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// addEntry adds the file at p as name; kept is false for what a tar of a
// filesystem skips (sockets).
func addEntry(tw *tar.Writer, p, name string) (kept bool, err error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return false, err
	}
	if fi.Mode()&fs.ModeSocket != 0 {
		return false, nil
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(p); err != nil {
			return false, err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return true, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return false, fmt.Errorf("%s: %w", p, err)
	}
	return true, nil
}

// WriteRootfsDiff writes what a container changed in its writable layer
// into dir: rootfs-diff.tar (files and directories of the overlay upper
// dir, without whiteouts) and deleted.files (the image files it removed:
// whiteouts, and directories made opaque, which the diff then refills).
func WriteRootfsDiff(upper, dir string) (retErr error) {
	f, err := os.OpenFile(filepath.Join(dir, RootfsDiffTar), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("rootfs diff: %w", err)
	}
	defer func() {
		if err := f.Close(); retErr == nil && err != nil {
			retErr = fmt.Errorf("rootfs diff: %w", err)
		}
	}()
	tw := tar.NewWriter(f)
	deleted := []string{}
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		if d.Type()&fs.ModeCharDevice != 0 {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err == nil && st.Rdev == 0 {
				deleted = append(deleted, "/"+name) // a whiteout
				return nil
			}
		}
		if d.IsDir() && isOpaque(p) {
			deleted = append(deleted, "/"+name)
		}
		_, err = addEntry(tw, p, name)
		return err
	})
	if err != nil {
		return fmt.Errorf("rootfs diff of %s: %w", upper, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("rootfs diff: %w", err)
	}
	return WriteJSON(dir, DeletedFiles, deleted)
}

func isOpaque(dir string) bool {
	var b [1]byte
	n, err := unix.Lgetxattr(dir, "trusted.overlay.opaque", b[:])
	return err == nil && n == 1 && b[0] == 'y'
}

// ApplyRootfsDiff replays a checkpoint's rootfs diff (in dir) onto a
// container's mounted rootfs: the deleted files go, then the diff's
// files are written. Everything happens through an os.Root on rootfs, so
// no name or symlink in the diff reaches outside it; device nodes and
// other special files are skipped (a container cannot make them).
func ApplyRootfsDiff(rootfs, dir string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("apply rootfs diff: %w", err)
	}
	defer root.Close()
	var deleted []string
	if err := ReadJSON(dir, DeletedFiles, &deleted); err != nil {
		return err
	}
	for _, p := range deleted {
		rel, ok := relName(p)
		if !ok {
			return fmt.Errorf("deleted.files: bad path %q: %w", p, errdefs.ErrInvalidArgument)
		}
		if err := root.RemoveAll(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("apply rootfs diff: remove %s: %w", p, err)
		}
	}
	f, err := os.Open(filepath.Join(dir, RootfsDiffTar))
	if err != nil {
		return fmt.Errorf("checkpoint %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	if name, err := extractAll(root, f); err != nil {
		if name == "" {
			return fmt.Errorf("read %s: %w", RootfsDiffTar, err)
		}
		return fmt.Errorf("apply rootfs diff: %s: %w", name, err)
	}
	return nil
}

// relName cleans an archive name into one relative to the root; false
// for names that try to leave it.
func relName(name string) (string, bool) {
	c := path.Clean("/" + name)
	if c == "/" || strings.Contains(name, "\x00") {
		return "", false
	}
	return c[1:], true
}

func extract(root *os.Root, hdr *tar.Header, r io.Reader) error {
	name, ok := relName(hdr.Name)
	if !ok {
		return fmt.Errorf("bad name: %w", errdefs.ErrInvalidArgument)
	}
	mode := fs.FileMode(hdr.Mode).Perm() | fs.FileMode(hdr.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.Mkdir(name, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case tar.TypeReg:
		_ = root.Remove(name)
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	case tar.TypeSymlink:
		_ = root.Remove(name)
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
	case tar.TypeLink:
		target, ok := relName(hdr.Linkname)
		if !ok {
			return fmt.Errorf("bad link target: %w", errdefs.ErrInvalidArgument)
		}
		_ = root.Remove(name)
		if err := root.Link(target, name); err != nil {
			return err
		}
	default:
		return nil
	}
	if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// Chown clears setuid bits: the mode goes last.
		if err := root.Chmod(name, mode); err != nil {
			return err
		}
		return root.Chtimes(name, hdr.AccessTime, hdr.ModTime)
	}
	return nil
}

// IsArchive reports whether the file at path looks like a container
// checkpoint archive: a tar whose entries include config.dump and
// spec.dump (CRI-O's test for an image name that is a checkpoint).
// Anything that cannot be read as such is false, not an error.
func IsArchive(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var config, spec bool
	for !(config && spec) {
		hdr, err := tr.Next()
		if err != nil {
			return false
		}
		switch name, _ := relName(hdr.Name); name {
		case ConfigDump:
			config = true
		case SpecDump:
			spec = true
		}
	}
	return true
}

// ExtractArchive unpacks a checkpoint archive (WriteArchive's output)
// into dir, which must exist. Names are resolved inside dir only; a
// malformed archive is InvalidArgument.
func ExtractArchive(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("checkpoint archive %s: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("extract checkpoint archive: %w", err)
	}
	defer root.Close()
	if name, err := extractAll(root, f); err != nil {
		if name == "" {
			return fmt.Errorf("checkpoint archive %s: %w", path, err)
		}
		return fmt.Errorf("checkpoint archive %s: %s: %w", path, name, err)
	}
	return nil
}

// extractAll extracts the tar stream r below root. On failure it names
// the entry that failed, or "" when the stream itself is unreadable (an
// InvalidArgument: a corrupt or cut archive).
func extractAll(root *os.Root, r io.Reader) (entry string, err error) {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
		}
		if err := extract(root, hdr, tr); err != nil {
			return hdr.Name, err
		}
	}
}
