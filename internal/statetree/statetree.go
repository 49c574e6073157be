// Package statetree holds the modes of berthd's state tree, closed to
// the node's other users (decision 3400, the CVE-2021-41103 class): a
// container's upper dir and merged rootfs can hold setuid-root files the
// container wrote, and its ID is public in /proc/self/mountinfo, so no
// host user may reach them by name.
//
// Only the top of the tree is searchable by others: --root, --state and
// <root>/containers are Traverse (0711, no listing), the way a user
// namespace pod's root (an unprivileged host uid) reaches its rootfs.
// Every directory below them is Private (0700), except a user namespace
// container's own directory, which is MappedRoot (0710) with the group of
// the pod's mapped root: that group, and no other host user, may pass.
package statetree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// The modes of the tree's directories.
const (
	Traverse   fs.FileMode = 0o711
	Private    fs.FileMode = 0o700
	MappedRoot fs.FileMode = 0o710
)

// Mkdir creates dir (and its missing parents) with mode, owned by root,
// and tightens an existing one to mode (Tighten).
func Mkdir(dir string, mode fs.FileMode) error {
	if err := os.MkdirAll(dir, mode); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return Tighten(dir, mode)
}

// Tighten takes from dir's mode every permission bit mode lacks (an older
// berthd made its tree 0711 and 0755): bits are only ever removed, so an
// operator's stricter choice stays. A missing dir is no error.
func Tighten(dir string, mode fs.FileMode) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (mode %v)", dir, fi.Mode())
	}
	have := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	want := have & mode.Perm()
	if want == have {
		return nil
	}
	if err := os.Chmod(dir, want); err != nil {
		return fmt.Errorf("tighten %s from %v to %v: %w", dir, have, want, err)
	}
	return nil
}

// OpenToMappedRoot makes dir MappedRoot with group gid: the host group of
// a user namespace pod's root, which must pass through dir to reach the
// container's rootfs (runc prepares the rootfs as that root, after
// joining the pod's user namespace). Others get nothing.
func OpenToMappedRoot(dir string, gid uint32) error {
	if err := os.Chown(dir, 0, int(gid)); err != nil {
		return fmt.Errorf("chown %s to group %d: %w", dir, gid, err)
	}
	if err := os.Chmod(dir, MappedRoot); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}
