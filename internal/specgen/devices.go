package specgen

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// applyDevices adds the CRI devices and their cgroup rules after a
// deny-all rule (runc adds its own default devices: null, zero, tty…).
func applyDevices(in *Input, s *specs.Spec) error {
	s.Linux.Resources.Devices = []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	for _, d := range in.Config.GetDevices() {
		devs, err := hostDevices(d.GetHostPath(), d.GetContainerPath())
		if err != nil {
			return fmt.Errorf("device %q: %w", d.GetHostPath(), err)
		}
		access, err := devicePermissions(d.GetPermissions())
		if err != nil {
			return fmt.Errorf("device %q: %w", d.GetHostPath(), err)
		}
		for _, dev := range devs {
			s.Linux.Devices = append(s.Linux.Devices, dev)
			major, minor := dev.Major, dev.Minor
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{
				Allow: true, Type: dev.Type, Major: &major, Minor: &minor, Access: access,
			})
		}
	}
	return nil
}

// devicePermissions checks a cgroup access string; "" means "rwm".
func devicePermissions(p string) (string, error) {
	if p == "" {
		return "rwm", nil
	}
	seen := map[rune]bool{}
	for _, c := range p {
		if !strings.ContainsRune("rwm", c) || seen[c] {
			return "", invalid("permissions %q: want letters of \"rwm\"", p)
		}
		seen[c] = true
	}
	return p, nil
}

// maxDeviceDirEntries bounds the walk of a directory given as a device.
const maxDeviceDirEntries = 4096

// hostDevices reads the device node at hostPath (following links), or every
// device node below it when it is a directory (as containerd), mapped under
// containerPath.
func hostDevices(hostPath, containerPath string) ([]specs.LinuxDevice, error) {
	if !path.IsAbs(hostPath) {
		return nil, invalid("host path is not absolute")
	}
	if containerPath == "" {
		containerPath = hostPath
	}
	if !path.IsAbs(containerPath) {
		return nil, invalid("container path %q is not absolute", containerPath)
	}
	real, err := filepath.EvalSymlinks(hostPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, invalid("no such device on the host")
		}
		return nil, fmt.Errorf("resolve: %w", err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	if !fi.IsDir() {
		d, ok, err := deviceNode(real, containerPath)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, invalid("%s is not a device node", real)
		}
		return []specs.LinuxDevice{d}, nil
	}
	var out []specs.LinuxDevice
	visited := 0
	err = filepath.WalkDir(real, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// A device directory (/dev/dri, /dev/snd) is small; "/" is a mistake.
		if visited++; visited > maxDeviceDirEntries {
			return invalid("directory %s has more than %d entries", real, maxDeviceDirEntries)
		}
		if e.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(real, p)
		d, ok, err := deviceNode(p, path.Join(containerPath, rel))
		if err == nil && ok {
			out = append(out, d)
		}
		return err
	})
	return out, err
}

// deviceNode describes the node at p; ok is false when it is not a
// character or block device.
func deviceNode(p, containerPath string) (specs.LinuxDevice, bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return specs.LinuxDevice{}, false, fmt.Errorf("stat %s: %w", p, err)
	}
	var typ string
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return specs.LinuxDevice{}, false, nil
	}
	mode := fs.FileMode(st.Mode & 0o777)
	uid, gid := st.Uid, st.Gid
	return specs.LinuxDevice{
		Path:     containerPath,
		Type:     typ,
		Major:    int64(unix.Major(st.Rdev)),
		Minor:    int64(unix.Minor(st.Rdev)),
		FileMode: &mode,
		UID:      &uid,
		GID:      &gid,
	}, true, nil
}

// allHostDevices lists every device node under dev for privileged
// containers, skipping the per-container ones runc or the mounts provide.
func allHostDevices(dev string) ([]specs.LinuxDevice, error) {
	if dev == "" {
		dev = "/dev"
	}
	var out []specs.LinuxDevice
	err := filepath.WalkDir(dev, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == dev {
				return err
			}
			return nil // a node vanished or is unreadable: skip it
		}
		if e.IsDir() {
			switch e.Name() {
			case "pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev":
				return filepath.SkipDir
			}
			return nil
		}
		if e.Name() == "console" {
			return nil
		}
		rel, _ := filepath.Rel(dev, p)
		d, ok, err := deviceNode(p, path.Join("/dev", rel))
		if err == nil && ok {
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list host devices in %s: %w", dev, err)
	}
	return out, nil
}
