// Package userns holds what berth needs for pods with their own user
// namespace (CRI NamespaceOption.UsernsOptions mode POD, the kubelet's
// hostUsers: false): validating the kubelet's ID mappings, starting a
// process in a new user namespace so the namespace can be pinned, and
// idmapped mounts (open_tree + mount_setattr MOUNT_ATTR_IDMAP), which runc
// 1.1 cannot make itself.
package userns

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// IDMap is one line of /proc/<pid>/uid_map or gid_map.
type IDMap struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

// Mapping is a pod's user namespace: one UID and one GID line, both
// mapping container ID 0 (the kubelet's contract).
type Mapping struct {
	UID IDMap `json:"uid"`
	GID IDMap `json:"gid"`
}

// FromCRI validates the kubelet's user namespace options. It returns nil
// for the host's user namespace (no options, or mode NODE) and the
// mapping for mode POD. Everything else is InvalidArgument: CONTAINER and
// TARGET modes, mappings with mode NODE, other than exactly one UID and
// one GID line, a line not mapping container ID 0, an empty or
// overflowing range.
func FromCRI(u *runtime.UserNamespace) (*Mapping, error) {
	if u == nil {
		return nil, nil
	}
	switch u.GetMode() {
	case runtime.NamespaceMode_NODE:
		if len(u.GetUids()) > 0 || len(u.GetGids()) > 0 {
			return nil, invalid("user namespace mode NODE takes no ID mappings, got %d UID and %d GID lines", len(u.GetUids()), len(u.GetGids()))
		}
		return nil, nil
	case runtime.NamespaceMode_POD:
	default:
		return nil, invalid("user namespace mode %s is not supported (only NODE or POD)", u.GetMode())
	}
	uid, err := oneLine("UID", u.GetUids())
	if err != nil {
		return nil, err
	}
	gid, err := oneLine("GID", u.GetGids())
	if err != nil {
		return nil, err
	}
	return &Mapping{UID: uid, GID: gid}, nil
}

func oneLine(kind string, lines []*runtime.IDMapping) (IDMap, error) {
	if len(lines) != 1 || lines[0] == nil {
		return IDMap{}, invalid("user namespace mode POD needs exactly one %s mapping, got %d", kind, len(lines))
	}
	l := lines[0]
	switch {
	case l.GetContainerId() != 0:
		return IDMap{}, invalid("%s mapping %d→%d (%d) does not map container ID 0", kind, l.GetContainerId(), l.GetHostId(), l.GetLength())
	case l.GetLength() == 0:
		return IDMap{}, invalid("%s mapping has length 0", kind)
	case uint64(l.GetHostId())+uint64(l.GetLength()) > math.MaxUint32:
		return IDMap{}, invalid("%s mapping host range %d+%d overflows", kind, l.GetHostId(), l.GetLength())
	}
	return IDMap{ContainerID: 0, HostID: l.GetHostId(), Size: l.GetLength()}, nil
}

// Same reports whether the CRI options describe exactly this mapping;
// nil m stands for the host's user namespace.
func Same(m *Mapping, u *runtime.UserNamespace) bool {
	other, err := FromCRI(u)
	if err != nil {
		return false
	}
	if m == nil || other == nil {
		return m == nil && other == nil
	}
	return *m == *other
}

// SameLines reports whether CRI ID mapping lines are exactly this one line.
func SameLines(l IDMap, lines []*runtime.IDMapping) bool {
	return len(lines) == 1 && lines[0] != nil && lines[0].GetContainerId() == l.ContainerID &&
		lines[0].GetHostId() == l.HostID && lines[0].GetLength() == l.Size
}

// OCI returns the mapping as an OCI spec's uidMappings and gidMappings.
func (m Mapping) OCI() (uids, gids []specs.LinuxIDMapping) {
	return []specs.LinuxIDMapping{{ContainerID: m.UID.ContainerID, HostID: m.UID.HostID, Size: m.UID.Size}},
		[]specs.LinuxIDMapping{{ContainerID: m.GID.ContainerID, HostID: m.GID.HostID, Size: m.GID.Size}}
}

// HolderOptions say what StartHolder starts.
type HolderOptions struct {
	// Binary is the program to run (berth-pause): it must stay alive until
	// signalled. It is opened here and executed through /proc/self/fd, so
	// its directory need not be searchable by the namespace's root.
	Binary string
	// Arg is the holder's one argument (berth-pause's state dir).
	Arg string
	// Cloneflags are more CLONE_NEW* flags. Created in the same clone as
	// the user namespace, those namespaces are owned by it, as the kernel
	// requires for the container's sysfs, mqueue and /proc mounts.
	Cloneflags uintptr
}

// StartHolder starts a process in a new user namespace with mapping m
// (setgroups allowed: containers set supplementary groups). The caller
// pins what it needs from /proc/<pid>/ns and then stops or keeps it.
func StartHolder(m Mapping, o HolderOptions) (*exec.Cmd, error) {
	bin, err := os.Open(o.Binary)
	if err != nil {
		return nil, fmt.Errorf("open user namespace holder: %w", err)
	}
	defer bin.Close()
	// fd 3 in the child is ExtraFiles[0].
	cmd := exec.Command("/proc/self/fd/3", o.Arg)
	cmd.Args[0] = o.Binary
	cmd.ExtraFiles = []*os.File{bin}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 unix.CLONE_NEWUSER | o.Cloneflags,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: int(m.UID.ContainerID), HostID: int(m.UID.HostID), Size: int(m.UID.Size)}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: int(m.GID.ContainerID), HostID: int(m.GID.HostID), Size: int(m.GID.Size)}},
		GidMappingsEnableSetgroups: true,
		// The namespace's root (berthd's uid 0 is not mapped in it), so
		// that berth-pause has the capabilities over its own mount
		// namespace to pivot into an empty root before it drops them.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		// Its own process group keeps signals to berthd's group away.
		Setpgid: true,
	}
	if err := StartPause(cmd); err != nil {
		return nil, fmt.Errorf("start %s in a new user namespace: %w", o.Binary, err)
	}
	return cmd, nil
}

// pauseReadyTimeout bounds how long StartPause waits for berth-pause to
// harden itself: a few system calls, but the node may be loaded.
const pauseReadyTimeout = 30 * time.Second

// StartPause starts cmd, a prepared berth-pause, the way it must run: in
// a mount namespace of its own (it pivots into an empty root there; the
// child marks the copy private before exec, so nothing propagates back),
// with an empty environment, and it returns once berth-pause reports
// that it dropped its privileges (docs/sandboxes.md). On failure the
// process is killed and reaped, and the error carries what it said.
func StartPause(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Unshareflags |= unix.CLONE_NEWNS
	cmd.Env = []string{}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("pipe for berth-pause: %w", err)
	}
	// Only berthd's end is non-blocking (for the deadline): a
	// non-blocking stdout would start the holder's network poller, two
	// more descriptors in pid 1 of the pod.
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return fmt.Errorf("pipe for berth-pause: %w", err)
	}
	r, w := os.NewFile(uintptr(p[0]), "berth-pause report"), os.NewFile(uintptr(p[1]), "berth-pause stdout")
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, w
	err := cmd.Start()
	w.Close()
	if err != nil {
		return err
	}
	_ = r.SetReadDeadline(time.Now().Add(pauseReadyTimeout))
	// Bounded: a holder that fails says one line.
	msg, err := io.ReadAll(io.LimitReader(r, 4096))
	if err == nil && string(msg) == "ok\n" {
		return nil
	}
	StopHolder(cmd)
	if err != nil {
		return fmt.Errorf("wait for berth-pause to drop its privileges: %w", err)
	}
	return fmt.Errorf("berth-pause could not drop its privileges: %s", bytes.TrimSpace(msg))
}

// StopHolder kills a holder and reaps it.
func StopHolder(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// IDMapClone makes an idmapped copy of the mount tree at src and attaches
// it at dst (an existing directory, or a file for a file src). Through the
// copy, what host ID k owns on disk shows as owned by the host ID the
// namespace open at nsFD maps its ID k to: the namespace's root owns what
// host root owns, and what it creates is stored as host root's. recursive
// also copies (and idmaps) the mounts below src.
func IDMapClone(src, dst string, nsFD int, recursive bool) error {
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	var setFlags uint
	if recursive {
		flags |= unix.AT_RECURSIVE
		setFlags = unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, flags)
	if err != nil {
		return fmt.Errorf("clone mount %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(nsFD)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|setFlags, attr); err != nil {
		err = fmt.Errorf("idmap mount of %s: %w", src, err)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (the filesystem or kernel cannot make idmapped mounts; user namespace pods need them): %w", err, errdefs.ErrFailedPrecondition)
		}
		return err
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach idmapped mount of %s at %s: %w", src, dst, err)
	}
	return nil
}

// ProbeIDMap reports whether the filesystem holding dir takes idmapped
// mounts, which berth needs for every user namespace pod's rootfs: it
// idmaps a detached copy of dir through a throwaway user namespace (held
// by holder) and never attaches it.
func ProbeIDMap(dir, holder string) error {
	cmd, err := StartHolder(Mapping{UID: IDMap{HostID: 65536, Size: 65536}, GID: IDMap{HostID: 65536, Size: 65536}}, HolderOptions{Binary: holder, Arg: "idmap-probe"})
	if err != nil {
		return err
	}
	defer StopHolder(cmd)
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	if err != nil {
		return fmt.Errorf("open probe user namespace: %w", err)
	}
	defer ns.Close()
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone mount %s: %w", dir, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("idmap mount of %s: %w", dir, err)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}
