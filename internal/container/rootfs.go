package container

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// Mounter builds a container's filesystem under its directory and takes it
// apart. overlayMounter (below) is the real one; unit tests put their own
// in Options.Mounter.
type Mounter interface {
	// Rootfs mounts the image's layers (topmost first) as the container's
	// root, writable through its own upper dir, and returns its path.
	Rootfs(dir string, layers []string, ns *UserNS) (string, error)
	// ImageVolume mounts image volume n (the CRI mount's index) read-only
	// and returns the host path to bind at its container path: subPath,
	// if set, inside the image.
	ImageVolume(dir string, n int, layers []string, subPath string, ns *UserNS) (string, error)
	// IDMapped makes idmapped copies of the CRI mounts that carry ID
	// mappings (a user namespace pod's volumes): container path → copy.
	IDMapped(dir string, mounts []*runtime.Mount, ns *UserNS) (map[string]string, error)
	// Unmount takes apart whatever the others left under dir, also after
	// a crash; nothing mounted is fine. Its error must stop a caller about
	// to remove dir: an idmapped copy still attached leads into a host
	// path.
	Unmount(dir string) error
}

// Rootfs is a container's filesystem as mounted under its directory: the
// root, its image volumes and idmapped copies of CRI mounts. Undo takes
// all of it apart, whatever part of it was mounted.
type Rootfs struct {
	Path string
	// Volumes maps each image volume's container path to the host path
	// to bind there.
	Volumes map[string]string
	// IDMapped maps each CRI mount with ID mappings to its idmapped copy.
	IDMapped map[string]string

	dir     string
	mounter Mounter
}

// Undo unmounts everything the container's filesystem is made of.
func (r *Rootfs) Undo() error { return r.mounter.Unmount(r.dir) }

// overlayMounter is overlayfs over the image's unpacked layers; in a pod
// with its own user namespace the layers are idmapped first (userns.go).
type overlayMounter struct{}

func (overlayMounter) Rootfs(dir string, layers []string, ns *UserNS) (string, error) {
	if ns == nil {
		return mountRootfs(dir, layers)
	}
	var rootfs string
	err := withUserNSFD(ns, func(fd int) (err error) {
		rootfs, err = mountRootfsIDMapped(dir, layers, fd, ns.Mapping)
		return err
	})
	return rootfs, err
}

// ImageVolume: in a pod with its own user namespace the volume's layers are
// idmapped as the rootfs's are, so files host root owns in the image show
// as the container root's.
func (overlayMounter) ImageVolume(dir string, n int, layers []string, subPath string, ns *UserNS) (string, error) {
	if ns == nil {
		return mountImageVolume(dir, n, layers, subPath)
	}
	var src string
	err := withUserNSFD(ns, func(fd int) error {
		return withIDMappedLayers(volumeIDMapDir(dir, n), layers, fd, func(mapped []string) (err error) {
			src, err = mountImageVolume(dir, n, mapped, subPath)
			return err
		})
	})
	return src, err
}

func (overlayMounter) IDMapped(dir string, mounts []*runtime.Mount, ns *UserNS) (map[string]string, error) {
	if ns == nil {
		return nil, nil
	}
	var out map[string]string
	err := withUserNSFD(ns, func(fd int) (err error) {
		out, err = mountIDMapped(dir, mounts, fd, ns.Mapping)
		return err
	})
	return out, err
}

func (overlayMounter) Unmount(dir string) error {
	return errors.Join(unmountImageVolumes(dir), unmountIDMounts(dir), unmountRootfs(dir))
}

// mountRootfs mounts overlayfs over the image's layer dirs (topmost first)
// with the container's own upper and work dirs below dir.
func mountRootfs(dir string, lowerDirs []string) (string, error) {
	rootfs := filepath.Join(dir, "rootfs")
	upper := filepath.Join(dir, "upper")
	work := filepath.Join(dir, "work")
	for _, d := range []string{rootfs, upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", d, err)
		}
	}
	if len(lowerDirs) == 0 {
		// An image without layers: overlay still needs one lower dir.
		empty := filepath.Join(dir, "empty")
		if err := os.MkdirAll(empty, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", empty, err)
		}
		lowerDirs = []string{empty}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowerDirs, ":"), upper, work)
	if len(opts) >= unix.Getpagesize() {
		return "", fmt.Errorf("overlay options for %d layers exceed a page (%d bytes)", len(lowerDirs), len(opts))
	}
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mount overlay at %s: %w", rootfs, err)
	}
	return rootfs, nil
}

// unmountRootfs detaches the container's rootfs; not mounted is fine.
func unmountRootfs(dir string) error {
	rootfs := filepath.Join(dir, "rootfs")
	for i := 0; i < 10; i++ {
		err := unix.Unmount(rootfs, unix.MNT_DETACH)
		if err == nil {
			continue // stacked mounts: go again until none is left
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("unmount %s: %w", rootfs, err)
	}
	return nil
}

// volumesDir holds the container's image volumes, one mount per volume.
func volumesDir(dir string) string { return filepath.Join(dir, "volumes") }

// mountImageVolume mounts an image's layers (topmost first) read-only at
// <dir>/volumes/<n>: an overlay without an upper dir cannot be written.
// subPath, if set, must name something inside the image; the returned
// path is what the container sees at the mount's container path.
func mountImageVolume(dir string, n int, lowerDirs []string, subPath string) (string, error) {
	base := volumesDir(dir)
	target := filepath.Join(base, strconv.Itoa(n))
	empty := filepath.Join(base, "empty")
	for _, d := range []string{target, empty} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", d, err)
		}
	}
	// Without an upper dir overlayfs wants two lower dirs at least.
	lowers := append(slices.Clone(lowerDirs), empty)
	opts := "lowerdir=" + strings.Join(lowers, ":")
	if len(opts) >= unix.Getpagesize() {
		return "", fmt.Errorf("overlay options for %d layers exceed a page (%d bytes)", len(lowers), len(opts))
	}
	if err := unix.Mount("overlay", target, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return "", fmt.Errorf("mount image volume at %s: %w", target, err)
	}
	if subPath == "" {
		return target, nil
	}
	// Resolve inside the image only: a symlink in it must not lead out.
	src, err := securejoin.SecureJoin(target, subPath)
	if err == nil {
		_, err = os.Stat(src)
	}
	if err != nil {
		_ = unix.Unmount(target, unix.MNT_DETACH)
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("image sub path %q does not exist in the image: %w", subPath, errdefs.ErrInvalidArgument)
		}
		return "", fmt.Errorf("image sub path %q: %w", subPath, err)
	}
	return src, nil
}

// unmountImageVolumes detaches every image volume of the container; none
// mounted is fine.
func unmountImageVolumes(dir string) error {
	es, err := os.ReadDir(volumesDir(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list image volumes: %w", err)
	}
	var errs []error
	for _, e := range es {
		p := filepath.Join(volumesDir(dir), e.Name())
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount image volume %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// replaceDevSymlink makes the image's /dev an empty directory in the
// container's writable layer when it is a symlink (CVE-2026-41579): runc
// before 1.3.6 and 1.4.3 mounts /dev's tmpfs where the link leads inside
// the rootfs, but then removes ptmx and creates its /dev symlinks (fd,
// stdin, stdout, stderr, ptmx) through a plain join of the rootfs path,
// which follows an absolute link to the host. berth always mounts a tmpfs
// on /dev, so what the image has there is never seen and an empty
// directory loses nothing: Docker's read-only init layer does the same.
// berth does it whatever the runc, as containerd does not.
func replaceDevSymlink(rootfs string) error {
	p := filepath.Join(rootfs, "dev")
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("image /dev: %w", err)
	}
	if fi.Mode()&os.ModeSymlink == 0 {
		return nil
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("image /dev is a symlink: replace it: %w", err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		return fmt.Errorf("image /dev is a symlink: replace it: %w", err)
	}
	return nil
}

// replaceMaskedSymlinks makes a masked path that is a symlink in the
// rootfs an empty file (or directory, if the link leads to one) in the
// container's writable layer. The runtime masks a path by mounting over
// it, which follows a symlink: masking /bin/ls (a link to busybox) would
// mask busybox itself and with it every applet. Paths under a mount
// destination are not in the rootfs and are left alone.
func replaceMaskedSymlinks(rootfs string, masked []string, mounts []specs.Mount) error {
	for _, p := range masked {
		p = path.Clean("/" + p)
		if p == "/" || underMount(p, mounts) {
			continue
		}
		parent, err := securejoin.SecureJoin(rootfs, path.Dir(p))
		if err != nil {
			return fmt.Errorf("masked path %s: %w", p, err)
		}
		full := filepath.Join(parent, path.Base(p))
		fi, err := os.Lstat(full)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("masked path %s: %w", p, err)
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			continue
		}
		// What the link leads to, resolved inside the rootfs.
		dir := false
		if target, err := securejoin.SecureJoin(rootfs, p); err == nil {
			if st, err := os.Stat(target); err == nil && st.IsDir() {
				dir = true
			}
		}
		if err := os.Remove(full); err != nil {
			return fmt.Errorf("masked path %s: replace symlink: %w", p, err)
		}
		if dir {
			err = os.Mkdir(full, 0o755)
		} else {
			var f *os.File
			if f, err = os.OpenFile(full, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("masked path %s: replace symlink: %w", p, err)
		}
	}
	return nil
}

// underMount reports whether p is at or below a mount destination.
func underMount(p string, mounts []specs.Mount) bool {
	for _, m := range mounts {
		d := path.Clean(m.Destination)
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}
