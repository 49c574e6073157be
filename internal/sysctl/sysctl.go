// Package sysctl is berth's one reading of a pod's sysctls: their names
// in either spelling, the /proc/sys file each one is, which namespace it
// belongs to, and what a name or value may hold. The sandbox writes them
// in the pod's namespaces and specgen passes them to the OCI runtime;
// both must agree on the file a name means, or the check that a sysctl is
// namespaced would look at one file and the write go to another.
package sysctl

import (
	"fmt"
	"regexp"
	"strings"
)

// Namespace is the namespace a sysctl belongs to.
type Namespace string

// The namespaces of the sysctls a pod may set; NotNamespaced for the rest,
// which would change the whole node.
const (
	NotNamespaced Namespace = ""
	Network       Namespace = "network"
	IPC           Namespace = "ipc"
	UTS           Namespace = "uts"
)

// ipc are the IPC-namespaced sysctls runc accepts (besides fs.mqueue.*).
var ipc = map[string]bool{
	"kernel.msgmax": true, "kernel.msgmnb": true, "kernel.msgmni": true, "kernel.sem": true,
	"kernel.shmall": true, "kernel.shmmax": true, "kernel.shmmni": true, "kernel.shm_rmid_forced": true,
}

// nameRE is Kubernetes' sysctl name (IsValidSysctlName): segments of
// lower-case letters, digits, '-' and '_' separated by '.' or '/'. It
// leaves no room for "..", an empty segment, '=' or '+' (what CRI-O's
// CVE-2022-0811 smuggled a second sysctl through), or white space.
var nameRE = regexp.MustCompile(`^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$`)

// maxName is Kubernetes' limit on a sysctl name.
const maxName = 253

// Key checks a sysctl name and returns it in the dotted form the kubelet
// and runc use: dots separate the /proc/sys path's components, and a
// slash stands for a dot inside one (net.ipv4.conf.eth0/100.forwarding).
// A name that holds a slash before any dot is in the slash form
// (net/ipv4/conf/eth0.100/forwarding, as sysctl(8) takes it): there the
// slashes separate and the dots stay, so the two are swapped.
func Key(name string) (string, error) {
	if len(name) > maxName || !nameRE.MatchString(name) {
		return "", fmt.Errorf("sysctl name %q is not a valid sysctl name", name)
	}
	if i := strings.IndexAny(name, "./"); i < 0 || name[i] == '.' {
		return name, nil
	}
	return swap(name), nil
}

// Path is the file below /proc/sys that a Key names, without the prefix:
// net.ipv4.conf.eth0/100.forwarding is net/ipv4/conf/eth0.100/forwarding.
func Path(key string) string { return swap(key) }

func swap(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '/':
			return '.'
		case '.':
			return '/'
		}
		return r
	}, s)
}

// NamespaceOf is the namespace of a Key's sysctl, as runc and the kubelet
// define them.
func NamespaceOf(key string) Namespace {
	switch {
	case strings.HasPrefix(key, "net."):
		return Network
	case ipc[key] || strings.HasPrefix(key, "fs.mqueue."):
		return IPC
	case key == "kernel.domainname" || key == "kernel.hostname":
		return UTS
	}
	return NotNamespaced
}

// CheckValue refuses a value that could be more than one sysctl's value:
// a NUL or line break (a second write), or '+' and '=', the separators
// CVE-2022-0811 abused to make CRI-O's pinns set kernel.core_pattern. berth
// writes each sysctl to its own file, so neither would reach another
// sysctl, but no namespaced sysctl takes them and the OCI runtime or a
// hook that joins sysctls must never see them.
func CheckValue(key, value string) error {
	if strings.ContainsAny(value, "\x00\n\r+=") {
		return fmt.Errorf("sysctl %s: value %q holds a NUL, line break, '+' or '='", key, value)
	}
	return nil
}
