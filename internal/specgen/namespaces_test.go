package specgen

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/userns"
)

// nsString renders namespaces as "type=path" (path "" = new) sorted.
func nsString(ns []specs.LinuxNamespace) string {
	var out []string
	for _, n := range ns {
		out = append(out, fmt.Sprintf("%s=%s", n.Type, n.Path))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func TestNamespaces(t *testing.T) {
	podAll := Pod{NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u", PIDNSPath: "/p"}
	for _, tc := range []struct {
		name     string
		pod      Pod
		opts     *runtime.NamespaceOption
		podPid   runtime.NamespaceMode
		podNet   runtime.NamespaceMode
		podIpc   runtime.NamespaceMode
		target   string
		cgroupV2 bool
		want     string
		hostname string
		err      error
	}{
		{name: "all pod", pod: podAll, want: "ipc=/i mount= network=/n pid=/p uts=/u", hostname: "podhost"},
		{name: "container pid", pod: podAll, opts: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_CONTAINER},
			want: "ipc=/i mount= network=/n pid= uts=/u", hostname: "podhost"},
		{name: "host network means host uts", pod: Pod{IPCNSPath: "/i", PIDNSPath: "/p"},
			opts: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE},
			want: "ipc=/i mount= pid=/p"},
		{name: "pod in host network, container default", pod: Pod{IPCNSPath: "/i", PIDNSPath: "/p"},
			podNet: runtime.NamespaceMode_NODE, want: "ipc=/i mount= pid=/p"},
		{name: "pod without netns path not in host network", pod: Pod{IPCNSPath: "/i", UTSNSPath: "/u", PIDNSPath: "/p"}, err: errInvalid},
		{name: "pod without ipc path not host ipc", pod: Pod{NetNSPath: "/n", UTSNSPath: "/u", PIDNSPath: "/p"}, err: errInvalid},
		{name: "pod host ipc, container default", pod: Pod{NetNSPath: "/n", UTSNSPath: "/u", PIDNSPath: "/p"},
			podIpc: runtime.NamespaceMode_NODE, want: "mount= network=/n pid=/p uts=/u", hostname: "podhost"},
		{name: "host everything", podPid: runtime.NamespaceMode_NODE,
			opts: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Ipc: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_NODE},
			want: "mount="},
		{name: "pod pid is host", podPid: runtime.NamespaceMode_NODE, pod: Pod{NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u"},
			want: "ipc=/i mount= network=/n uts=/u", hostname: "podhost"},
		{name: "pod pid without path", pod: Pod{NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u"}, podPid: runtime.NamespaceMode_CONTAINER, err: errInvalid},
		{name: "target", pod: podAll, target: "/proc/42/ns/pid",
			opts: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_TARGET, TargetId: "other"},
			want: "ipc=/i mount= network=/n pid=/proc/42/ns/pid uts=/u", hostname: "podhost"},
		{name: "target without path", pod: podAll, opts: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_TARGET, TargetId: "other"}, err: errInvalid},
		{name: "node network but pod has netns", pod: podAll, opts: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE}, err: errInvalid},
		{name: "container network refused", pod: podAll, opts: &runtime.NamespaceOption{Network: runtime.NamespaceMode_CONTAINER}, err: errInvalid},
		{name: "target ipc refused", pod: podAll, opts: &runtime.NamespaceOption{Ipc: runtime.NamespaceMode_TARGET}, err: errInvalid},
		{name: "user namespace refused", pod: podAll, opts: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD}}, err: errInvalid},
		{name: "host user namespace fine", pod: podAll, opts: &runtime.NamespaceOption{UsernsOptions: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}},
			want: "ipc=/i mount= network=/n pid=/p uts=/u", hostname: "podhost"},
		{name: "cgroup ns on v2", pod: podAll, cgroupV2: true, want: "cgroup= ipc=/i mount= network=/n pid=/p uts=/u", hostname: "podhost"},
		{name: "unknown pid mode", pod: podAll, opts: &runtime.NamespaceOption{Pid: 9}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Pod = tc.pod
			in.TargetPIDNSPath = tc.target
			in.Host.CgroupV2 = tc.cgroupV2
			sc(&in).NamespaceOptions = tc.opts
			in.SandboxConfig.Linux.SecurityContext.NamespaceOptions = &runtime.NamespaceOption{Pid: tc.podPid, Network: tc.podNet, Ipc: tc.podIpc}
			s := &specs.Spec{Linux: &specs.Linux{}}
			err := applyNamespaces(&in, s)
			wantErr(t, err, tc.err)
			if tc.err != nil {
				return
			}
			if got := nsString(s.Linux.Namespaces); got != tc.want {
				t.Fatalf("namespaces %q, want %q", got, tc.want)
			}
			if s.Hostname != tc.hostname {
				t.Fatalf("hostname %q, want %q", s.Hostname, tc.hostname)
			}
		})
	}
}

func TestSysctls(t *testing.T) {
	own := []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: "/n"}, {Type: specs.IPCNamespace, Path: "/i"}, {Type: specs.UTSNamespace, Path: "/u"}}
	for _, tc := range []struct {
		name    string
		sysctls map[string]string
		ns      []specs.LinuxNamespace
		want    map[string]string
		err     error
	}{
		{name: "none", ns: own},
		{name: "namespaced", ns: own, sysctls: map[string]string{"net.ipv4.ip_forward": "1", "kernel/shm_rmid_forced": "1", "kernel.msgmax": "9"},
			want: map[string]string{"net.ipv4.ip_forward": "1", "kernel.shm_rmid_forced": "1", "kernel.msgmax": "9"}},
		{name: "slash form with dotted interface", ns: own, sysctls: map[string]string{"net/ipv6/conf/eth0.100/disable_ipv6": "1"},
			want: map[string]string{"net.ipv6.conf.eth0/100.disable_ipv6": "1"}},
		{name: "domainname", ns: own, sysctls: map[string]string{"kernel.domainname": "x"}, want: map[string]string{"kernel.domainname": "x"}},
		{name: "hostname refused", ns: own, sysctls: map[string]string{"kernel.hostname": "x"}, err: errInvalid},
		{name: "unknown kernel.msg sysctl", ns: own, sysctls: map[string]string{"kernel.msg_next_id": "1"}, err: errInvalid},
		{name: "not namespaced", ns: own, sysctls: map[string]string{"vm.swappiness": "1"}, err: errInvalid},
		{name: "net in host network", sysctls: map[string]string{"net.core.somaxconn": "1"}, err: errInvalid},
		{name: "ipc in host ipc", ns: own[:1], sysctls: map[string]string{"kernel.sem": "1 2 3 4"}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.SandboxConfig.Linux.Sysctls = tc.sysctls
			s := &specs.Spec{Linux: &specs.Linux{Namespaces: tc.ns}}
			err := applySysctls(&in, s)
			wantErr(t, err, tc.err)
			if tc.err == nil && fmt.Sprint(s.Linux.Sysctl) != fmt.Sprint(tc.want) {
				t.Fatalf("sysctl %v, want %v", s.Linux.Sysctl, tc.want)
			}
		})
	}
}

func TestUserNamespace(t *testing.T) {
	m := &userns.Mapping{UID: userns.IDMap{HostID: 1000, Size: 100000}, GID: userns.IDMap{HostID: 2000, Size: 65536}}
	podUserns := Pod{NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u", PIDNSPath: "/p", UserNSPath: "/user", UserNS: m}
	same := &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD,
		Uids: []*runtime.IDMapping{{HostId: 1000, Length: 100000}}, Gids: []*runtime.IDMapping{{HostId: 2000, Length: 65536}}}
	other := &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD,
		Uids: []*runtime.IDMapping{{HostId: 5000, Length: 100000}}, Gids: []*runtime.IDMapping{{HostId: 2000, Length: 65536}}}
	for _, tc := range []struct {
		name string
		pod  Pod
		opts *runtime.UserNamespace
		err  error
	}{
		{name: "pod's, not restated", pod: podUserns},
		{name: "pod's, restated", pod: podUserns, opts: same},
		{name: "other mapping", pod: podUserns, opts: other, err: errInvalid},
		{name: "host's in a userns pod", pod: podUserns, opts: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}, err: errInvalid},
		{name: "pod's in a pod without one", pod: Pod{NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u", PIDNSPath: "/p"}, opts: same, err: errInvalid},
		{name: "mode container", pod: podUserns, opts: &runtime.UserNamespace{Mode: runtime.NamespaceMode_CONTAINER}, err: errInvalid},
		{name: "mapping without pin", pod: Pod{NetNSPath: "/n", IPCNSPath: "/i", UTSNSPath: "/u", PIDNSPath: "/p", UserNS: m}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Pod = tc.pod
			sc(&in).NamespaceOptions = &runtime.NamespaceOption{UsernsOptions: tc.opts}
			s := &specs.Spec{Linux: &specs.Linux{}}
			err := applyNamespaces(&in, s)
			wantErr(t, err, tc.err)
			if tc.err != nil {
				return
			}
			// The user namespace comes first: runc joins it before the
			// namespaces it owns.
			if got := s.Linux.Namespaces[0]; got.Type != specs.UserNamespace || got.Path != "/user" {
				t.Fatalf("first namespace %+v", got)
			}
			if fmt.Sprint(s.Linux.UIDMappings, s.Linux.GIDMappings) != "[{0 1000 100000}] [{0 2000 65536}]" {
				t.Fatalf("mappings %v %v", s.Linux.UIDMappings, s.Linux.GIDMappings)
			}
		})
	}
}
