package specgen

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// applyMounts sets the default mounts, the pod's files and the CRI mounts,
// and the rootfs propagation the CRI mounts need.
func applyMounts(in *Input, s *specs.Spec) error {
	cri, err := criMounts(in)
	if err != nil {
		return err
	}
	// Sort by depth so that a mount never hides a deeper one (containerd,
	// docker); stable keeps the config's order among equals.
	sort.SliceStable(cri, func(i, j int) bool { return depth(cri[i].m.Destination) < depth(cri[j].m.Destination) })

	taken := map[string]bool{}
	for _, c := range cri {
		taken[c.m.Destination] = true
	}
	var out []specs.Mount
	for _, m := range defaultMounts(in) {
		if taken[m.Destination] || (taken["/dev"] && strings.HasPrefix(m.Destination, "/dev/")) {
			continue
		}
		out = append(out, m)
	}
	propagation := ""
	for _, c := range cri {
		out = append(out, c.m)
		// rshared wins over rslave; private needs nothing (runc's default).
		if c.rootPropagation == "rshared" || (c.rootPropagation == "rslave" && propagation == "") {
			propagation = c.rootPropagation
		}
	}
	s.Mounts = out
	s.Linux.RootfsPropagation = propagation
	return nil
}

func depth(p string) int { return strings.Count(path.Clean(p), "/") }

// defaultMounts are containerd's (without /run), with /dev/shm from the pod.
func defaultMounts(in *Input) []specs.Mount {
	sc := in.Config.GetLinux().GetSecurityContext()
	ro := "ro"
	if sc.GetPrivileged() {
		ro = "rw"
	}
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		shmMount(in),
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		sysMount(in, ro),
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", ro}},
	}
	return ms
}

// sysMount is a fresh sysfs, except in a pod with its own user namespace
// on the host's network: the kernel mounts sysfs only for a user
// namespace that owns the network namespace (EPERM otherwise), so the
// container gets the host's /sys bound recursively read-only (as
// containerd and CRI-O do), privileged or not. Without runtime support
// for "rro" only the top mount is read-only; the submounts keep the
// host's flags, and their files belong to host IDs the pod's user
// namespace does not map.
func sysMount(in *Input, ro string) specs.Mount {
	if in.Pod.UserNS == nil || in.Pod.NetNSPath != "" {
		return specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", ro}}
	}
	rro := "ro"
	if in.Host.RecursiveReadOnly {
		rro = "rro"
	}
	return specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", rro}}
}

// shmMount is the host's /dev/shm for host IPC (as containerd), the pod's
// shared tmpfs when it has one, else a private tmpfs.
func shmMount(in *Input) specs.Mount {
	bind := func(src string) specs.Mount {
		return specs.Mount{Destination: "/dev/shm", Type: "bind", Source: src, Options: []string{"rbind", "rprivate", "rw"}}
	}
	hostIPC := in.Config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetIpc() == runtime.NamespaceMode_NODE ||
		in.SandboxConfig.GetLinux().GetSecurityContext().GetNamespaceOptions().GetIpc() == runtime.NamespaceMode_NODE
	switch {
	case hostIPC:
		return bind("/dev/shm")
	case in.Pod.ShmPath != "":
		// The pod's tmpfs is mounted nosuid,nodev,noexec; the bind says so
		// too, rather than rely on inheriting the flags (containerd's).
		m := bind(in.Pod.ShmPath)
		m.Options = append(m.Options, "nosuid", "nodev", "noexec")
		return m
	}
	return specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}
}

// criMount is one bind mount and the rootfs propagation it needs.
type criMount struct {
	m               specs.Mount
	rootPropagation string
}

// criMounts are the config's mounts plus the pod's hostname, hosts and
// resolv.conf where the config does not mount its own.
func criMounts(in *Input) ([]criMount, error) {
	sc := in.Config.GetLinux().GetSecurityContext()
	mounts := slices.Clone(in.Config.GetMounts())
	own := map[string]bool{}
	for _, m := range mounts {
		own[path.Clean(m.GetContainerPath())] = true
	}
	for _, f := range []struct{ dst, src string }{
		{"/etc/hostname", in.Pod.HostnamePath},
		{"/etc/hosts", in.Pod.HostsPath},
		{"/etc/resolv.conf", in.Pod.ResolvConfPath},
	} {
		if f.src == "" || own[f.dst] {
			continue
		}
		if _, err := os.Stat(f.src); err != nil {
			// containerd skips a missing pod file the same way.
			in.Logger.Debug("pod file missing, not mounted", "path", f.src, "err", err)
			continue
		}
		mounts = append(mounts, &runtime.Mount{ContainerPath: f.dst, HostPath: f.src, Readonly: sc.GetReadonlyRootfs()})
	}
	var out []criMount
	seen := map[string]bool{}
	for _, m := range mounts {
		c, err := bindMount(in, m)
		if err != nil {
			return nil, fmt.Errorf("mount %q: %w", m.GetContainerPath(), err)
		}
		if seen[c.m.Destination] {
			return nil, invalid("mount %q: duplicate container path", m.GetContainerPath())
		}
		seen[c.m.Destination] = true
		out = append(out, c)
	}
	return out, nil
}

// extraBindOptions are the CRI mount_options berth passes on: per-mount
// flags that are safe on a bind mount.
var extraBindOptions = []string{
	"noexec", "exec", "nodev", "dev", "nosuid", "suid",
	"noatime", "atime", "nodiratime", "diratime", "relatime", "norelatime", "strictatime", "nostrictatime",
}

// bindMount turns one CRI mount into a bind mount, creating a missing host
// path as a directory (kubelet expects it) and checking that the host
// mount allows the requested propagation.
func bindMount(in *Input, m *runtime.Mount) (criMount, error) {
	dst, src := m.GetContainerPath(), m.GetHostPath()
	if m.GetImage() != nil {
		vol, ok := in.ImageVolumes[dst]
		switch {
		case !ok:
			return criMount{}, invalid("image volume at %q was not mounted", dst)
		case !m.GetReadonly():
			return criMount{}, invalid("image volume at %q must be readonly", dst)
		}
		src = vol
	}
	switch {
	case !path.IsAbs(dst):
		return criMount{}, invalid("container path %q is not absolute", dst)
	case !path.IsAbs(src):
		return criMount{}, invalid("host path %q is not absolute", src)
	}
	idmapped := len(m.GetUidMappings()) > 0 || len(m.GetGidMappings()) > 0
	if idmapped {
		// The container package made the idmapped copy; only a mount it
		// made one for (a user namespace pod's, with the pod's mapping)
		// gets here with a source.
		copySrc, ok := in.IDMappedMounts[dst]
		if !ok {
			return criMount{}, invalid("id-mapped mount at %q: only a pod with its own user namespace takes ID mappings, and only its own", dst)
		}
		src = copySrc
	}
	if path.Clean(dst) == "/" {
		return criMount{}, invalid("cannot mount over the container's root")
	}
	if m.GetSelinuxRelabel() && in.Host.SELinux {
		return criMount{}, invalid("selinux relabel is not supported")
	}

	opts := []string{"rbind"}
	var rootProp string
	switch m.GetPropagation() {
	case runtime.MountPropagation_PROPAGATION_PRIVATE:
		opts = append(opts, "rprivate")
	case runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER:
		opts = append(opts, "rslave")
		rootProp = "rslave"
	case runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL:
		opts = append(opts, "rshared")
		rootProp = "rshared"
	default:
		return criMount{}, invalid("unknown propagation %d", m.GetPropagation())
	}
	switch {
	case m.GetRecursiveReadOnly() && !m.GetReadonly():
		return criMount{}, invalid("recursive read-only needs readonly: true")
	case m.GetRecursiveReadOnly() && m.GetPropagation() != runtime.MountPropagation_PROPAGATION_PRIVATE:
		return criMount{}, invalid("recursive read-only needs private propagation, got %s", m.GetPropagation())
	case m.GetRecursiveReadOnly() && !in.Host.RecursiveReadOnly:
		return criMount{}, invalid("the OCI runtime does not support recursive read-only mounts")
	case m.GetRecursiveReadOnly():
		opts = append(opts, "rro")
	case m.GetReadonly():
		opts = append(opts, "ro")
	default:
		opts = append(opts, "rw")
	}

	if m.GetImage() != nil {
		// The image volume's overlay is mounted nosuid,nodev: say so, or
		// the runtime's read-only remount of the bind would clear them,
		// which a user namespace's container may not do (EPERM).
		opts = append(opts, "nosuid", "nodev")
	}
	for _, o := range m.GetMountOptions() {
		if !slices.Contains(extraBindOptions, o) {
			return criMount{}, invalid("mount option %q is not one of %q", o, extraBindOptions)
		}
		opts = append(opts, o)
	}

	if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) && m.GetImage() == nil {
		if err := os.MkdirAll(src, 0o755); err != nil {
			return criMount{}, fmt.Errorf("create host path %s: %w", src, err)
		}
	} else if err != nil {
		return criMount{}, fmt.Errorf("stat host path %s: %w", src, err)
	}
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return criMount{}, fmt.Errorf("resolve host path %s: %w", src, err)
	}
	if rootProp != "" {
		if err := checkPropagation(in.Host.MountInfoPath, real, rootProp); err != nil {
			return criMount{}, err
		}
	}
	return criMount{
		m:               specs.Mount{Destination: path.Clean(dst), Type: "bind", Source: real, Options: opts},
		rootPropagation: rootProp,
	}, nil
}

// checkPropagation fails unless the host mount holding p is shared (for
// rshared) or shared or a slave (for rslave): otherwise the container would
// silently see no propagation at all.
func checkPropagation(mountinfo, p, want string) error {
	if mountinfo == "" {
		mountinfo = "/proc/self/mountinfo"
	}
	f, err := os.Open(mountinfo)
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var best, optional string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options optional... - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 7 || sep < 6 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == p || mp == "/" || strings.HasPrefix(p, mp+"/") {
			// The last mount at the longest prefix is the one on top.
			if len(mp) >= len(best) {
				best, optional = mp, strings.Join(fields[6:sep], " ")
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	shared := strings.Contains(optional, "shared:")
	slave := strings.Contains(optional, "master:")
	if shared || (want == "rslave" && slave) {
		return nil
	}
	kind := "shared"
	if want == "rslave" {
		kind = "shared or slave"
	}
	return fmt.Errorf("host path %s is on mount %s which is not %s, needed for %s propagation: %w",
		p, best, kind, want, errdefs.ErrFailedPrecondition)
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for space…).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
