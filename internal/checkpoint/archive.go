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
	"syscall"

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
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == "." {
			return err
		}
		_, err = addEntry(tw, root, name)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// addEntry adds the file name below root; kept is false for what a tar
// of a filesystem skips (sockets). The tree may be a running container's
// writable layer: every name is resolved through root (a directory
// swapped for a symlink cannot lead out of it), and a regular file is
// opened and described by what fstat says of the file opened, which
// must be the one the lstat saw (a file swapped for a symlink after the
// lstat is refused, not followed; issue 34, finding 9).
func addEntry(tw *tar.Writer, root *os.Root, name string) (kept bool, err error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return false, err
	}
	return addLstated(tw, root, name, fi)
}

// addLstated is addEntry once name has been lstat'ed as fi, which may be
// stale by now (the container runs): split out so that a test can swap
// the file between the two.
func addLstated(tw *tar.Writer, root *os.Root, name string, fi fs.FileInfo) (kept bool, err error) {
	if fi.Mode()&fs.ModeSocket != 0 {
		return false, nil
	}
	var f *os.File
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if link, err = root.Readlink(name); err != nil {
			return false, err
		}
	case fi.Mode().IsRegular():
		// O_NONBLOCK: a FIFO swapped in must not block the open.
		f, err = root.OpenFile(name, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return false, fmt.Errorf("%s: %w", name, err)
		}
		defer f.Close()
		lfi := fi
		if fi, err = f.Stat(); err != nil {
			return false, fmt.Errorf("%s: %w", name, err)
		}
		if !fi.Mode().IsRegular() {
			return false, fmt.Errorf("%s: changed into %v while it was read", name, fi.Mode().Type())
		}
		// os.Root follows a symlink that stays inside the root even
		// with O_NOFOLLOW: a file swapped for a symlink to another file
		// of the tree opens that file. Only the file lstat saw is read.
		if !os.SameFile(lfi, fi) {
			return false, fmt.Errorf("%s: replaced by another file while it was read", name)
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return false, fmt.Errorf("%s: %w", name, err)
	}
	hdr.Name = filepath.ToSlash(name)
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return false, err
	}
	if f == nil {
		return true, nil
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return false, fmt.Errorf("%s: %w", name, err)
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
	root, err := os.OpenRoot(upper)
	if err != nil {
		return fmt.Errorf("rootfs diff: %w", err)
	}
	defer root.Close()
	tw := tar.NewWriter(f)
	deleted := []string{}
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || name == "." {
			return err
		}
		p := filepath.Join(upper, name)
		if d.Type()&fs.ModeCharDevice != 0 {
			if fi, err := root.Lstat(name); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Rdev == 0 {
					deleted = append(deleted, "/"+name) // a whiteout
					return nil
				}
			}
		}
		if d.IsDir() && isOpaque(p) {
			deleted = append(deleted, "/"+name)
		}
		_, err = addEntry(tw, root, name)
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
	f, err := os.OpenFile(filepath.Join(dir, RootfsDiffTar), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	if name, err := extractAll(root, f, false); err != nil {
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
	for n := 0; !(config && spec); n++ {
		hdr, err := tr.Next()
		if err != nil || n >= maxEntries {
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
	if name, err := extractAll(root, f, true); err != nil {
		if name == "" {
			return fmt.Errorf("checkpoint archive %s: %w", path, err)
		}
		return fmt.Errorf("checkpoint archive %s: %s: %w", path, name, err)
	}
	return nil
}

// maxEntries bounds the entries of an archive or rootfs diff berthd
// unpacks (each one an inode on berthd's disk).
const maxEntries = 1 << 20

// extractAll extracts the tar file f below root. On failure it names the
// entry that failed, or "" when the stream itself is unreadable or breaks
// a bound (an InvalidArgument: a corrupt, cut or hostile archive). What it
// writes is bounded by f's own size and maxEntries: a sparse entry, which
// a few bytes of tar make read as terabytes of zeros (issue 34, finding
// 9), is refused, and so is an entry larger than what is left of the file.
//
// plain refuses every entry but directories and regular files: a
// checkpoint archive holds nothing else, and a symlink in it (say
// rootfs-diff.tar pointing at a host file) would be followed by what
// reads the unpacked checkpoint.
func extractAll(root *os.Root, f *os.File, plain bool) (entry string, err error) {
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	budget := fi.Size()
	tr := tar.NewReader(f)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
		}
		if n >= maxEntries {
			return "", fmt.Errorf("more than %d entries: %w", maxEntries, errdefs.ErrInvalidArgument)
		}
		if isSparse(hdr) {
			return hdr.Name, fmt.Errorf("sparse entries are refused: %w", errdefs.ErrInvalidArgument)
		}
		if hdr.Size < 0 || hdr.Size > budget {
			return hdr.Name, fmt.Errorf("entry of %d bytes is larger than its archive: %w", hdr.Size, errdefs.ErrInvalidArgument)
		}
		budget -= hdr.Size
		if plain && hdr.Typeflag != tar.TypeDir && hdr.Typeflag != tar.TypeReg {
			return hdr.Name, fmt.Errorf("a checkpoint archive holds only directories and regular files, not type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument)
		}
		if err := extract(root, hdr, tr); err != nil {
			return hdr.Name, err
		}
	}
}

// isSparse reports a GNU sparse entry, old (type 'S') or PAX (0.x, 1.0).
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}
