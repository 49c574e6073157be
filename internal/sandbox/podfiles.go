package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/sysctl"
)

// The same defaults containerd writes for a pod with its own network.
const defaultHosts = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
fe00::0	ip6-localnet
fe00::0	ip6-mcastprefix
fe00::1	ip6-allnodes
fe00::2	ip6-allrouters
`

// shmSize is the per-pod /dev/shm size, as containerd.
const shmSize = 64 << 20

// hostsContentFrom is the pod's /etc/hosts: the host's (read with
// readFile) for a pod on the host's network, containerd's defaults
// otherwise.
func hostsContentFrom(readFile func(string) ([]byte, error), hostNetwork bool) ([]byte, error) {
	if hostNetwork {
		b, err := readFile("/etc/hosts")
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read host /etc/hosts: %w", err)
		}
	}
	return []byte(defaultHosts), nil
}

// resolvConfContent renders the DNS config, or copies the host's file when
// the pod gives none (kubelet's ClusterFirst always gives one).
func resolvConfContent(dns *runtime.DNSConfig) ([]byte, error) {
	return resolvConfContentFrom(os.ReadFile, dns)
}

func resolvConfContentFrom(readFile func(string) ([]byte, error), dns *runtime.DNSConfig) ([]byte, error) {
	if dns == nil || (len(dns.Servers) == 0 && len(dns.Searches) == 0 && len(dns.Options) == 0) {
		b, err := readFile("/etc/resolv.conf")
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read host /etc/resolv.conf: %w", err)
		}
		return b, nil
	}
	var b strings.Builder
	if len(dns.Searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(dns.Searches, " "))
	}
	for _, s := range dns.Servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(dns.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(dns.Options, " "))
	}
	return []byte(b.String()), nil
}

// validateSysctls normalises keys to the dotted form (package sysctl)
// and refuses sysctls that are not namespaced or whose namespace the pod
// shares with the host, and names or values that could be more than the
// one sysctl they claim to be.
func validateSysctls(in map[string]string, hostNetwork, hostIPC bool) (map[string]string, error) {
	out := make(map[string]string, len(in))
	for k, v := range in {
		key, err := sysctl.Key(k)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		switch sysctl.NamespaceOf(key) {
		case sysctl.IPC:
			if hostIPC {
				return nil, fmt.Errorf("sysctl %q needs the pod's own IPC namespace, but the pod uses the host's: %w", k, errdefs.ErrInvalidArgument)
			}
		case sysctl.Network:
			if hostNetwork {
				return nil, fmt.Errorf("sysctl %q needs the pod's own network namespace, but the pod uses the host's: %w", k, errdefs.ErrInvalidArgument)
			}
		case sysctl.UTS:
			if key != "kernel.domainname" {
				return nil, fmt.Errorf("sysctl %q conflicts with the pod's hostname: %w", k, errdefs.ErrInvalidArgument)
			}
			if hostNetwork {
				return nil, fmt.Errorf("sysctl %q needs the pod's own UTS namespace: %w", k, errdefs.ErrInvalidArgument)
			}
		default:
			return nil, fmt.Errorf("sysctl %q is not namespaced and cannot be set per pod: %w", k, errdefs.ErrInvalidArgument)
		}
		if err := sysctl.CheckValue(k, v); err != nil {
			return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
		}
		out[key] = v
	}
	return out, nil
}
