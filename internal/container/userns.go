package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/statetree"
	"github.com/berthcri/berth/internal/userns"
)

// UserNS is the pod's own user namespace, for a container that joins it.
type UserNS struct {
	Path    string // the pod's pin of the namespace
	Mapping userns.Mapping
}

// withUserNSFD calls f with an open descriptor of the pod's user
// namespace, which idmapped mounts are mapped through.
func withUserNSFD(ns *UserNS, f func(fd int) error) error {
	nsFile, err := os.Open(ns.Path)
	if err != nil {
		return fmt.Errorf("open the pod's user namespace: %w", err)
	}
	defer nsFile.Close()
	return f(int(nsFile.Fd()))
}

// layersIDMapDir holds idmapped copies of the image layers only while the
// overlay is mounted over them: overlayfs keeps private clones of its
// layers, so the copies are detached right after.
func layersIDMapDir(dir string) string { return filepath.Join(dir, "idmap") }

// volumeIDMapDir holds the idmapped copies of image volume n's layers
// while its overlay is mounted (unmountIDMounts cleans up after a crash).
func volumeIDMapDir(dir string, n int) string {
	return filepath.Join(dir, "idmap-vol"+strconv.Itoa(n))
}

// idMountsDir holds the idmapped copies of the container's CRI mounts that
// carry ID mappings, one per mount, for the container's life.
func idMountsDir(dir string) string { return filepath.Join(dir, "idmounts") }

// mountRootfsIDMapped mounts the rootfs of a container in a user
// namespace. overlayfs cannot itself be idmapped (mount_setattr gives
// EINVAL), but it takes idmapped layers: each image layer is idmapped
// through the pod's namespace (nsFD), so what host root owns shows as the
// container root's, and the container's own upper dir belongs to the
// host IDs the container's root maps to, where its writes land.
func mountRootfsIDMapped(dir string, lowerDirs []string, nsFD int, m userns.Mapping) (string, error) {
	upper := filepath.Join(dir, "upper")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", upper, err)
	}
	if err := os.Chown(upper, int(m.UID.HostID), int(m.GID.HostID)); err != nil {
		return "", fmt.Errorf("chown %s to the pod's root: %w", upper, err)
	}
	var rootfs string
	err := withIDMappedLayers(layersIDMapDir(dir), lowerDirs, nsFD, func(mapped []string) error {
		var err error
		rootfs, err = mountRootfs(dir, mapped)
		return err
	})
	if err != nil {
		return "", err
	}
	return rootfs, nil
}

// withIDMappedLayers idmaps each image layer through the pod's user
// namespace (nsFD) into tmp and calls mount with the copies, topmost
// first like lowerDirs. overlayfs keeps private clones of its layers, so
// the copies are detached and tmp removed once mount returns.
func withIDMappedLayers(tmp string, lowerDirs []string, nsFD int, mount func(mapped []string) error) (retErr error) {
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err := detachAll(tmp); err != nil {
			retErr = errors.Join(retErr, err)
			return
		}
		if err := os.RemoveAll(tmp); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("remove %s: %w", tmp, err))
		}
	}()
	mapped := make([]string, len(lowerDirs))
	for i, l := range lowerDirs {
		d := filepath.Join(tmp, strconv.Itoa(i))
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
		if err := userns.IDMapClone(l, d, nsFD, false); err != nil {
			return fmt.Errorf("image layer: %w", err)
		}
		mapped[i] = d
	}
	return mount(mapped)
}

// mountIDMapped makes an idmapped copy, through the pod's namespace, of
// the host path of every CRI mount that carries ID mappings (the
// kubelet's volumes of a user namespace pod), and returns container path
// → copy for specgen. The mappings must be the pod's: the copy is mapped
// through the pod's namespace. Undo with unmountIDMounts, also on error.
func mountIDMapped(dir string, mounts []*runtime.Mount, nsFD int, m userns.Mapping) (map[string]string, error) {
	out := map[string]string{}
	for n, cm := range mounts {
		if cm.GetImage() != nil || (len(cm.GetUidMappings()) == 0 && len(cm.GetGidMappings()) == 0) {
			continue
		}
		if !userns.SameLines(m.UID, cm.GetUidMappings()) || !userns.SameLines(m.GID, cm.GetGidMappings()) {
			return nil, fmt.Errorf("mount %q: ID mappings differ from the pod's user namespace: %w", cm.GetContainerPath(), errdefs.ErrInvalidArgument)
		}
		src := cm.GetHostPath()
		if !filepath.IsAbs(src) {
			return nil, fmt.Errorf("mount %q: host path %q is not absolute: %w", cm.GetContainerPath(), src, errdefs.ErrInvalidArgument)
		}
		// A missing host path becomes a directory, as for any bind mount.
		if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(src, 0o755); err != nil {
				return nil, fmt.Errorf("create host path %s: %w", src, err)
			}
		}
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			return nil, fmt.Errorf("resolve host path %s: %w", src, err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("stat host path %s: %w", real, err)
		}
		if err := os.MkdirAll(idMountsDir(dir), 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", idMountsDir(dir), err)
		}
		dst := filepath.Join(idMountsDir(dir), strconv.Itoa(n))
		if fi.IsDir() {
			err = os.Mkdir(dst, 0o755)
		} else {
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("create idmapped mount point %s: %w", dst, err)
		}
		if err := userns.IDMapClone(real, dst, nsFD, true); err != nil {
			return nil, fmt.Errorf("mount %q: %w", cm.GetContainerPath(), err)
		}
		out[cm.GetContainerPath()] = dst
	}
	return out, nil
}

// unmountIDMounts detaches and removes the container's idmapped mount
// copies; none is fine. Its error must stop a caller about to remove the
// container dir: a copy still attached would lead into the host path.
func unmountIDMounts(dir string) error {
	// Image volumes' idmapped layers live in idmap-vol<n> while mounting.
	volTmps, _ := filepath.Glob(filepath.Join(dir, "idmap-vol*"))
	for _, d := range append([]string{idMountsDir(dir), layersIDMapDir(dir)}, volTmps...) {
		if err := detachAll(d); err != nil {
			return err
		}
	}
	for _, d := range append([]string{idMountsDir(dir), layersIDMapDir(dir)}, volTmps...) {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("remove %s: %w", d, err)
		}
	}
	return nil
}

// detachAll lazily unmounts every entry of dir (each a mount point, or
// left from a failed attempt); a missing dir is fine.
func detachAll(dir string) error {
	es, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		for {
			err := unix.Unmount(p, unix.MNT_DETACH)
			if err == nil {
				continue // stacked: again until none is left
			}
			if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
			break
		}
	}
	return errors.Join(errs...)
}

// makeDir creates the container's directory closed to host users
// (decision 3400): its upper dir and rootfs may hold setuid files the
// container wrote. A user namespace container's root must still pass
// through it to its rootfs: the dir is then open to that root's group.
func (d *Draft) makeDir() error {
	if err := statetree.Mkdir(d.dir, statetree.Private); err != nil {
		return fmt.Errorf("create container dir: %w", err)
	}
	if ns := d.req.UserNS; ns != nil {
		return statetree.OpenToMappedRoot(d.dir, ns.Mapping.GID.HostID)
	}
	return nil
}

// closeDir tightens a container dir an older berthd made 0711: Private,
// or open to the group of the user namespace root that owns its upper dir.
func closeDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "upper"), &st); err == nil && st.Uid != 0 {
		return statetree.OpenToMappedRoot(dir, st.Gid)
	}
	return statetree.Tighten(dir, statetree.Private)
}
