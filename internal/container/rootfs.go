package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

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
