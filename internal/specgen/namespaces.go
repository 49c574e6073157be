package specgen

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/sysctl"
	"github.com/berthcri/berth/internal/userns"
)

// applyNamespaces joins the pod's network, IPC and UTS namespaces (none
// when the pod uses the host's), picks the PID namespace per the
// container's mode, and always makes a new mount namespace. The hostname
// is set only in a UTS namespace that is not the host's.
func applyNamespaces(in *Input, s *specs.Spec) error {
	ns, err := namespaces(in)
	if err != nil {
		return err
	}
	s.Linux.Namespaces = ns
	if in.Pod.UserNS != nil {
		// runc 1.1 wants the mappings even when joining a namespace.
		s.Linux.UIDMappings, s.Linux.GIDMappings = in.Pod.UserNS.OCI()
	}
	for _, n := range ns {
		if n.Type == specs.UTSNamespace {
			s.Hostname = in.SandboxConfig.GetHostname()
		}
	}
	return nil
}

func namespaces(in *Input) ([]specs.LinuxNamespace, error) {
	opts := in.Config.GetLinux().GetSecurityContext().GetNamespaceOptions()
	podOpts := in.SandboxConfig.GetLinux().GetSecurityContext().GetNamespaceOptions()
	out := []specs.LinuxNamespace{{Type: specs.MountNamespace}}
	// The user namespace is the pod's: a container may restate it (the
	// kubelet does) but not ask for another, as in containerd.
	if u := opts.GetUsernsOptions(); u != nil && !userns.Same(in.Pod.UserNS, u) {
		if _, err := userns.FromCRI(u); err != nil {
			return nil, err
		}
		return nil, invalid("user namespace options (mode %s) differ from the pod's", u.GetMode())
	}
	if in.Pod.UserNS != nil {
		if in.Pod.UserNSPath == "" {
			return nil, invalid("the pod has a user namespace mapping but no namespace to join")
		}
		// Listed first: runc joins it before the namespaces it owns.
		out = append([]specs.LinuxNamespace{{Type: specs.UserNamespace, Path: in.Pod.UserNSPath}}, out...)
	}

	// Network, IPC and UTS always follow the pod, as in containerd; a
	// container asking for something else is refused, not ignored.
	for _, x := range []struct {
		name    string
		typ     specs.LinuxNamespaceType
		mode    runtime.NamespaceMode
		podMode runtime.NamespaceMode
		path    string
	}{
		{"network", specs.NetworkNamespace, opts.GetNetwork(), podOpts.GetNetwork(), in.Pod.NetNSPath},
		{"ipc", specs.IPCNamespace, opts.GetIpc(), podOpts.GetIpc(), in.Pod.IPCNSPath},
		// UTS follows the network: a hostNetwork pod has the host's name.
		{"uts", specs.UTSNamespace, opts.GetNetwork(), podOpts.GetNetwork(), in.Pod.UTSNSPath},
	} {
		switch x.mode {
		case runtime.NamespaceMode_POD:
		case runtime.NamespaceMode_NODE:
			if x.path != "" {
				return nil, invalid("%s namespace mode NODE but the pod has its own %s namespace", x.name, x.name)
			}
		default:
			return nil, invalid("%s namespace mode %s is not supported (only POD or NODE)", x.name, x.mode)
		}
		if x.path != "" {
			out = append(out, specs.LinuxNamespace{Type: x.typ, Path: x.path})
			continue
		}
		// No path: the pod must really use the host's namespace, never a
		// container landing in it by accident.
		if x.mode != runtime.NamespaceMode_NODE && x.podMode != runtime.NamespaceMode_NODE {
			return nil, invalid("%s namespace: the pod has none to join and does not use the host's", x.name)
		}
	}

	switch mode := opts.GetPid(); mode {
	case runtime.NamespaceMode_POD:
		switch {
		case in.Pod.PIDNSPath != "":
			out = append(out, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: in.Pod.PIDNSPath})
		case podOpts.GetPid() == runtime.NamespaceMode_NODE:
			// The pod's PID namespace is the host's.
		default:
			return nil, invalid("pid namespace mode POD but the pod has no shared PID namespace")
		}
	case runtime.NamespaceMode_CONTAINER:
		out = append(out, specs.LinuxNamespace{Type: specs.PIDNamespace})
	case runtime.NamespaceMode_NODE:
	case runtime.NamespaceMode_TARGET:
		if opts.GetTargetId() == "" || in.TargetPIDNSPath == "" {
			return nil, invalid("pid namespace mode TARGET needs target_id and its PID namespace")
		}
		out = append(out, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: in.TargetPIDNSPath})
	default:
		return nil, invalid("unknown pid namespace mode %d", mode)
	}

	// A cgroup namespace hides the host's cgroup tree; on v1 containerd
	// skips it for compatibility, and privileged containers see the host's.
	if in.Host.CgroupV2 && !in.Config.GetLinux().GetSecurityContext().GetPrivileged() {
		out = append(out, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	}
	return out, nil
}

// applySysctls sets the pod's sysctls (CRI keeps them in the sandbox
// config) in the container's namespaces. Only namespaced sysctls are
// allowed, and only when the namespace is not the host's: runc would
// refuse the rest later with a worse message.
func applySysctls(in *Input, s *specs.Spec) error {
	sysctls := in.SandboxConfig.GetLinux().GetSysctls()
	if len(sysctls) == 0 {
		return nil
	}
	has := map[specs.LinuxNamespaceType]bool{}
	for _, n := range s.Linux.Namespaces {
		has[n.Type] = true
	}
	out := make(map[string]string, len(sysctls))
	for k, v := range sysctls {
		key, err := sysctl.Key(k)
		if err != nil {
			return invalid("%v", err)
		}
		var need specs.LinuxNamespaceType
		switch sysctl.NamespaceOf(key) {
		case sysctl.Network:
			need = specs.NetworkNamespace
		case sysctl.IPC:
			need = specs.IPCNamespace
		case sysctl.UTS:
			if key != "kernel.domainname" {
				// runc refuses it: the spec's hostname field (the pod's) owns it.
				return invalid("sysctl kernel.hostname conflicts with the pod hostname")
			}
			need = specs.UTSNamespace
		default:
			return invalid("sysctl %q is not namespaced", k)
		}
		if !has[need] {
			return invalid("sysctl %q needs a %s namespace of the pod's own, not the host's", k, need)
		}
		if err := sysctl.CheckValue(k, v); err != nil {
			return invalid("%v", err)
		}
		out[key] = v
	}
	s.Linux.Sysctl = out
	return nil
}
