package specgen

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// defaultCapabilities is containerd's default set.
var defaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// defaultMaskedPaths and defaultReadonlyPaths are containerd's.
var (
	defaultMaskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
		"/sys/devices/virtual/powercap", "/proc/scsi",
	}
	defaultReadonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// applyCapabilities sets bounding, effective and permitted sets; never
// inheritable or ambient (Kubernetes leaves non-root + caps undefined;
// containerd and docker clear ambient).
func applyCapabilities(in *Input, s *specs.Spec) error {
	c := in.Config.GetLinux().GetSecurityContext().GetCapabilities()
	caps, err := capabilities(c, in.Host.AllCapabilities)
	if err != nil {
		return err
	}
	s.Process.Capabilities = &specs.LinuxCapabilities{
		Bounding: caps, Effective: slices.Clone(caps), Permitted: slices.Clone(caps),
	}
	ambient, err := ambientCapabilities(c.GetAddAmbientCapabilities(), caps)
	if err != nil {
		return err
	}
	if len(ambient) > 0 {
		// The kernel keeps an ambient cap only if it is also permitted and
		// inheritable; ambient caps survive exec as a non-root user.
		s.Process.Capabilities.Ambient = ambient
		s.Process.Capabilities.Inheritable = slices.Clone(ambient)
	}
	return nil
}

// ambientCapabilities normalizes add_ambient_capabilities; each must be in
// the container's set (containerd drops the field; berth honours it).
func ambientCapabilities(names, set []string) ([]string, error) {
	var out []string
	for _, n := range names {
		u := strings.ToUpper(strings.TrimSpace(n))
		if !strings.HasPrefix(u, "CAP_") {
			u = "CAP_" + u
		}
		if !slices.Contains(knownCapabilities, u) {
			return nil, invalid("unknown ambient capability %q", n)
		}
		if !slices.Contains(set, u) {
			return nil, invalid("ambient capability %s is not in the container's capabilities", u)
		}
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out, nil
}

// capabilities applies CRI add/drop to the default set: "ALL" in add
// starts from every capability, "ALL" in drop from none, then the named
// ones are added and dropped. Names are case-insensitive, with or without
// "CAP_".
func capabilities(c *runtime.Capability, all []string) ([]string, error) {
	set := slices.Clone(defaultCapabilities)
	if c == nil {
		return set, nil
	}
	norm := func(list []string) (names []string, hasAll bool, err error) {
		for _, n := range list {
			u := strings.ToUpper(strings.TrimSpace(n))
			if u == "ALL" {
				hasAll = true
				continue
			}
			if !strings.HasPrefix(u, "CAP_") {
				u = "CAP_" + u
			}
			if !slices.Contains(knownCapabilities, u) {
				return nil, false, invalid("unknown capability %q", n)
			}
			names = append(names, u)
		}
		return names, hasAll, nil
	}
	add, addAll, err := norm(c.GetAddCapabilities())
	if err != nil {
		return nil, err
	}
	drop, dropAll, err := norm(c.GetDropCapabilities())
	if err != nil {
		return nil, err
	}
	if addAll {
		set = slices.Clone(all)
	}
	if dropAll {
		set = nil
	}
	for _, a := range add {
		if !slices.Contains(all, a) {
			return nil, invalid("capability %s: berthd does not hold it (or the kernel lacks it), so it cannot grant it", a)
		}
		if !slices.Contains(set, a) {
			set = append(set, a)
		}
	}
	set = slices.DeleteFunc(set, func(x string) bool { return slices.Contains(drop, x) })
	if set == nil {
		set = []string{}
	}
	return set, nil
}

// applyMaskedPaths uses the CRI lists when given (an empty list masks
// nothing). An unset list is ambiguous: protobuf drops an empty repeated
// field, so the kubelet's procMount: Unmasked (it sends both lists empty)
// arrives as unset. The kubelet sends the full default lists for every
// other container, and the API allows Unmasked only with hostUsers:
// false, so an unset list means "mask nothing" in a pod with its own
// user namespace (what containerd and CRI-O do for every pod: they start
// from empty lists) and containerd's default lists elsewhere, so that a
// client that says nothing (crictl) keeps a masked /proc where its root
// is the host's.
func applyMaskedPaths(in *Input, s *specs.Spec) error {
	sc := in.Config.GetLinux().GetSecurityContext()
	masked, ro := defaultMaskedPaths, defaultReadonlyPaths
	if in.Pod.UserNS != nil {
		masked, ro = []string{}, []string{}
	}
	if sc.GetMaskedPaths() != nil {
		masked = sc.GetMaskedPaths()
	}
	if sc.GetReadonlyPaths() != nil {
		ro = sc.GetReadonlyPaths()
	}
	for _, p := range append(slices.Clone(masked), ro...) {
		if !path.IsAbs(p) {
			return invalid("masked or read-only path %q is not absolute", p)
		}
	}
	s.Linux.MaskedPaths = slices.Clone(masked)
	s.Linux.ReadonlyPaths = slices.Clone(ro)
	return nil
}

// applyPrivileged gives a privileged container every capability and host
// device and removes masked and read-only paths (sysfs and cgroupfs are
// made writable by the mounts step; seccomp and LSM steps skip it).
func applyPrivileged(in *Input, s *specs.Spec) error {
	if !in.Config.GetLinux().GetSecurityContext().GetPrivileged() {
		return nil
	}
	if !in.SandboxConfig.GetLinux().GetSecurityContext().GetPrivileged() {
		return invalid("privileged container in a pod that is not privileged")
	}
	all := in.Host.AllCapabilities
	c := s.Process.Capabilities
	c.Bounding, c.Effective, c.Permitted = slices.Clone(all), slices.Clone(all), slices.Clone(all)
	s.Linux.MaskedPaths = nil
	s.Linux.ReadonlyPaths = nil
	devs, err := allHostDevices(in.Host.DevPath)
	if err != nil {
		return err
	}
	s.Linux.Devices = append(devs, s.Linux.Devices...)
	s.Linux.Resources.Devices = []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
	return nil
}

// securityProfile picks the new SecurityProfile field, else parses the
// deprecated path string ("", runtime/default, docker/default, unconfined,
// localhost/<path>). ok is false when neither is set.
func securityProfile(p *runtime.SecurityProfile, legacy string) (*runtime.SecurityProfile, error) {
	if p != nil {
		if p.GetProfileType() != runtime.SecurityProfile_Localhost && p.GetLocalhostRef() != "" {
			return nil, invalid("localhost_ref is only for profile type Localhost")
		}
		return p, nil
	}
	switch legacy {
	case "":
		return nil, nil
	case "runtime/default", "docker/default":
		return &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}, nil
	case "unconfined":
		return &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}, nil
	}
	if ref, ok := strings.CutPrefix(legacy, "localhost/"); ok {
		return &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Localhost, LocalhostRef: ref}, nil
	}
	return nil, invalid("invalid profile %q", legacy)
}

// applySeccomp sets the seccomp filter. No profile at all is unconfined
// (the kubelet sends RuntimeDefault when the pod asks for it); privileged
// containers get none. Reads the capabilities: the default profile allows
// some syscalls only to holders of a capability.
func applySeccomp(in *Input, s *specs.Spec) error {
	sc := in.Config.GetLinux().GetSecurityContext()
	//lint:ignore SA1019 the deprecated field is still sent by older kubelets and critest
	p, err := securityProfile(sc.GetSeccomp(), sc.GetSeccompProfilePath())
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	if sc.GetPrivileged() || p == nil {
		return nil
	}
	switch p.GetProfileType() {
	case runtime.SecurityProfile_Unconfined:
		return nil
	case runtime.SecurityProfile_RuntimeDefault:
		s.Linux.Seccomp, err = seccomp.GetDefaultProfile(s)
		if err != nil {
			return fmt.Errorf("seccomp default profile: %w", err)
		}
		return nil
	case runtime.SecurityProfile_Localhost:
		ref := strings.TrimPrefix(p.GetLocalhostRef(), "localhost/")
		if !path.IsAbs(ref) {
			return invalid("seccomp localhost profile %q is not an absolute path", ref)
		}
		body, err := readProfile(ref)
		if err != nil {
			return err
		}
		s.Linux.Seccomp, err = seccomp.LoadProfile(string(body), s)
		if err != nil {
			return invalid("seccomp profile %s: %v", ref, err)
		}
		return nil
	}
	return invalid("unknown seccomp profile type %d", p.GetProfileType())
}

// applyLSM handles AppArmor and SELinux. With AppArmor on, RuntimeDefault
// is berth's own profile (loaded on first use, as containerd and CRI-O
// load theirs) and Localhost a profile the node has loaded; privileged
// containers get RuntimeDefault as unconfined. With AppArmor off,
// RuntimeDefault and unconfined are ignored with a debug note (containerd)
// and Localhost is refused. berth does no SELinux labelling: SELinux
// options are ignored on a host without SELinux and refused on one with.
func applyLSM(in *Input, s *specs.Spec) error {
	sc := in.Config.GetLinux().GetSecurityContext()
	//lint:ignore SA1019 the deprecated field is still sent by older kubelets and critest
	aa, err := securityProfile(sc.GetApparmor(), sc.GetApparmorProfile())
	if err != nil {
		return fmt.Errorf("apparmor: %w", err)
	}
	if aa != nil {
		switch t := aa.GetProfileType(); {
		case t == runtime.SecurityProfile_Unconfined:
		case t == runtime.SecurityProfile_Localhost && in.Host.AppArmor:
			name := strings.TrimPrefix(aa.GetLocalhostRef(), "localhost/")
			if name == "" {
				return invalid("apparmor localhost profile without a name")
			}
			if in.AppArmor != nil {
				loaded, err := in.AppArmor.Loaded(name)
				if err != nil {
					return fmt.Errorf("apparmor profile %q: %w", name, err)
				}
				if !loaded {
					return invalid("apparmor profile %q is not loaded on this node", name)
				}
			}
			s.Process.ApparmorProfile = name
		case t == runtime.SecurityProfile_Localhost:
			return invalid("apparmor profile %q requested but AppArmor is not enabled on this host", aa.GetLocalhostRef())
		case t == runtime.SecurityProfile_RuntimeDefault && !in.Host.AppArmor:
			in.Logger.Debug("AppArmor is not enabled on this host: the runtime/default profile means unconfined")
		case t == runtime.SecurityProfile_RuntimeDefault && sc.GetPrivileged():
		case t == runtime.SecurityProfile_RuntimeDefault:
			if in.AppArmor == nil {
				return invalid("no default AppArmor profile is configured; use a localhost profile or unconfined")
			}
			name, err := in.AppArmor.Default()
			if err != nil {
				return fmt.Errorf("apparmor runtime/default: %w", err)
			}
			s.Process.ApparmorProfile = name
		default:
			return invalid("unknown apparmor profile type %d", t)
		}
	}
	if o := sc.GetSelinuxOptions(); o != nil && (o.GetUser() != "" || o.GetRole() != "" || o.GetType() != "" || o.GetLevel() != "") {
		if in.Host.SELinux {
			return invalid("SELinux labels are not supported by berth")
		}
		in.Logger.Debug("SELinux is not enabled on this host: ignoring selinux_options",
			"user", o.GetUser(), "role", o.GetRole(), "type", o.GetType(), "level", o.GetLevel())
	}
	return nil
}

// maxProfileSize bounds a localhost seccomp profile (docker's default
// profile is ~20 KiB).
const maxProfileSize = 4 << 20

// readProfile reads a regular file of at most maxProfileSize: a FIFO or a
// device named by mistake must not hang CreateContainer.
func readProfile(p string) ([]byte, error) {
	// Stat before open: opening some devices has side effects.
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, invalid("seccomp localhost profile %s does not exist", p)
	} else if err != nil {
		return nil, fmt.Errorf("stat seccomp profile %s: %w", p, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxProfileSize {
		return nil, invalid("seccomp localhost profile %s is not a regular file of at most %d bytes", p, maxProfileSize)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open seccomp profile %s: %w", p, err)
	}
	defer f.Close()
	body, err := io.ReadAll(io.LimitReader(f, maxProfileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read seccomp profile %s: %w", p, err)
	}
	return body, nil
}
