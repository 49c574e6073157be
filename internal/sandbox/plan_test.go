package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/errdefs"
)

// testHost is a node for planPod: fixed ID and clock, a host name and
// host files of its own, berth-pause found, user namespaces supported.
func testHost() *planHost {
	files := map[string]string{
		"/etc/hosts":       "10.1.1.1 thehost\n",
		"/etc/resolv.conf": "nameserver 10.0.0.53\n",
	}
	return &planHost{
		sandboxes: "/root/sandboxes", netns: "/state/netns", state: "/state/sandboxes",
		cgroupName: (&Store{opts: Options{CgroupParent: "berth"}}).podCgroupName,
		cgroupfsPlan: func(id, pod string, holder bool) cgroupplan.Plan {
			return cgroupplan.Pod(cgroupplan.Input{V2: true, PodID: id, Pod: pod, Holder: holder, Controllers: []string{"cpu", "memory", "pids"}})
		},
		newID:    func() string { return "abc" },
		now:      func() time.Time { return time.Unix(1000, 0) },
		hostname: func() (string, error) { return "thehost", nil },
		readFile: func(p string) ([]byte, error) {
			if d, ok := files[p]; ok {
				return []byte(d), nil
			}
			return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
		},
		pauseBinary:   func() (string, error) { return "/bin/berth-pause", nil },
		usernsSupport: func() error { return nil },
	}
}

func podCfg(edit func(*runtime.PodSandboxConfig)) *runtime.PodSandboxConfig {
	cfg := &runtime.PodSandboxConfig{
		Metadata: &runtime.PodSandboxMetadata{Name: "web", Namespace: "ns", Uid: "u1", Attempt: 1},
		Hostname: "web-0",
		Linux:    &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{NamespaceOptions: &runtime.NamespaceOption{Pid: runtime.NamespaceMode_CONTAINER}}},
	}
	if edit != nil {
		edit(cfg)
	}
	return cfg
}

func nsOpts(cfg *runtime.PodSandboxConfig) *runtime.NamespaceOption {
	return cfg.Linux.SecurityContext.NamespaceOptions
}

func userNS(host uint32) *runtime.UserNamespace {
	m := []*runtime.IDMapping{{HostId: host, ContainerId: 0, Length: 65536}}
	return &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: m, Gids: m}
}

func fileOf(p *podPlan, path string) string {
	for _, f := range p.files {
		if f.path == path {
			return string(f.data)
		}
	}
	return "<none>"
}

func TestPlanPod(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*runtime.PodSandboxConfig)
		check func(t *testing.T, p *podPlan)
	}{{
		name: "own namespaces",
		check: func(t *testing.T, p *podPlan) {
			sb := p.sb
			if sb.ID != "abc" || sb.RuntimeHandler != "runc" || sb.State != runtime.PodSandboxState_SANDBOX_NOTREADY || !sb.CreatedAt.Equal(time.Unix(1000, 0)) {
				t.Errorf("sandbox: %+v", sb)
			}
			if p.name != "web_ns_u1_1" || p.dir != "/root/sandboxes/abc" || p.stateDir != "/state/sandboxes/abc" {
				t.Errorf("name %q, dirs %q %q", p.name, p.dir, p.stateDir)
			}
			if !p.attach || sb.NetNSPath != "/state/netns/abc-net" || sb.UTSNSPath != "/state/netns/abc-uts" || sb.IPCNSPath != "/state/netns/abc-ipc" || sb.UserNSPath != "" {
				t.Errorf("namespaces: attach %v, %q %q %q %q", p.attach, sb.NetNSPath, sb.UTSNSPath, sb.IPCNSPath, sb.UserNSPath)
			}
			if p.ns.netPin != sb.NetNSPath || p.ns.utsPin != sb.UTSNSPath || p.ns.ipcPin != sb.IPCNSPath || p.ns.hostname != "web-0" || p.ns.pause != nil || p.ns.holder != nil || p.holder {
				t.Errorf("namespace request: %+v", p.ns)
			}
			if sb.ShmPath != "/state/sandboxes/abc/shm" || p.shmOptions != fmt.Sprintf("mode=1777,size=%d", shmSize) {
				t.Errorf("shm %q %q", sb.ShmPath, p.shmOptions)
			}
			if sb.CgroupParent != "/berth/pod-abc" || sb.CgroupUnit != "" || p.cgroups == nil || len(p.cgroups.Made()) != 1 || p.cgroups.Made()[0].Path != "/berth/pod-abc" {
				t.Errorf("cgroup %q %q, plan:\n%v", sb.CgroupParent, sb.CgroupUnit, p.cgroups)
			}
			if _, ok := p.cgroups.Holder(); ok {
				t.Errorf("holder cgroup planned for a pod without berth-pause:\n%v", p.cgroups)
			}
			if fileOf(p, sb.HostnamePath) != "web-0\n" || fileOf(p, sb.HostsPath) != defaultHosts || fileOf(p, sb.ResolvConfPath) != "nameserver 10.0.0.53\n" {
				t.Errorf("files: %q", p.files)
			}
		},
	}, {
		name: "host network",
		edit: func(c *runtime.PodSandboxConfig) { nsOpts(c).Network = runtime.NamespaceMode_NODE },
		check: func(t *testing.T, p *podPlan) {
			if p.attach || p.sb.NetNSPath != "" || p.sb.UTSNSPath != "" || p.ns.netPin != "" || p.ns.utsPin != "" {
				t.Errorf("host network pod gets a network: attach %v, %q %q", p.attach, p.sb.NetNSPath, p.sb.UTSNSPath)
			}
			if p.sb.IPCNSPath == "" {
				t.Error("host network pod lost its own IPC namespace")
			}
			if fileOf(p, p.sb.HostnamePath) != "thehost\n" || fileOf(p, p.sb.HostsPath) != "10.1.1.1 thehost\n" {
				t.Errorf("host network pod files: %q", p.files)
			}
		},
	}, {
		name: "host IPC",
		edit: func(c *runtime.PodSandboxConfig) { nsOpts(c).Ipc = runtime.NamespaceMode_NODE },
		check: func(t *testing.T, p *podPlan) {
			if p.sb.IPCNSPath != "" || p.sb.ShmPath != "" || p.shmOptions != "" || p.ns.ipcPin != "" {
				t.Errorf("host IPC pod: %q %q %q", p.sb.IPCNSPath, p.sb.ShmPath, p.shmOptions)
			}
		},
	}, {
		name: "shared PID (CRI's default)",
		edit: func(c *runtime.PodSandboxConfig) { c.Linux = nil },
		check: func(t *testing.T, p *podPlan) {
			if !p.holder || p.ns.pause == nil || p.ns.pause.binary != "/bin/berth-pause" || p.ns.pause.arg != p.stateDir || p.ns.holder != nil {
				t.Errorf("shared PID: holder %v, pause %+v", p.holder, p.ns.pause)
			}
			if h, ok := p.cgroups.Holder(); !ok || h.Path != "/berth/pod-abc/"+cgroupplan.HolderName {
				t.Errorf("holder cgroup %+v %v:\n%v", h, ok, p.cgroups)
			}
			if err := p.cgroups.Check(); err != nil {
				t.Error(err)
			}
		},
	}, {
		name: "user namespace",
		edit: func(c *runtime.PodSandboxConfig) { nsOpts(c).UsernsOptions = userNS(100000) },
		check: func(t *testing.T, p *podPlan) {
			sb := p.sb
			if sb.UserNSPath != "/state/netns/abc-user" || sb.UserNS == nil || sb.UserNS.UID.HostID != 100000 || p.ns.userns != sb.UserNS || p.ns.userPin != sb.UserNSPath {
				t.Errorf("user namespace: %q %+v, request %+v", sb.UserNSPath, sb.UserNS, p.ns)
			}
			if !p.holder || p.ns.holder == nil || p.ns.holder.binary != "/bin/berth-pause" || p.ns.pause != nil {
				t.Errorf("user namespace holder: %v %+v %+v", p.holder, p.ns.holder, p.ns.pause)
			}
			if !strings.HasSuffix(p.shmOptions, ",uid=100000,gid=100000") {
				t.Errorf("shm options %q: not owned by the pod's root", p.shmOptions)
			}
		},
	}, {
		name: "user namespace on the host network",
		edit: func(c *runtime.PodSandboxConfig) {
			nsOpts(c).UsernsOptions, nsOpts(c).Network = userNS(200000), runtime.NamespaceMode_NODE
		},
		check: func(t *testing.T, p *podPlan) {
			if p.attach || p.sb.UserNSPath == "" {
				t.Errorf("attach %v, user namespace %q", p.attach, p.sb.UserNSPath)
			}
		},
	}, {
		name: "sysctls",
		edit: func(c *runtime.PodSandboxConfig) {
			c.Linux.Sysctls = map[string]string{"net/ipv4/ip_forward": "1", "kernel.shmmax": "100"}
		},
		check: func(t *testing.T, p *podPlan) {
			if len(p.ns.sysctls) != 2 || p.ns.sysctls["net.ipv4.ip_forward"] != "1" || p.ns.sysctls["kernel.shmmax"] != "100" {
				t.Errorf("sysctls %v", p.ns.sysctls)
			}
		},
	}, {
		name: "ports and DNS",
		edit: func(c *runtime.PodSandboxConfig) {
			c.PortMappings = []*runtime.PortMapping{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 53, Protocol: runtime.Protocol_UDP}}
			c.DnsConfig = &runtime.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"ns.svc"}}
		},
		check: func(t *testing.T, p *podPlan) {
			if len(p.ports) != 1 || p.ports[0].HostPort != 8080 || p.ports[0].ContainerPort != 80 || p.ports[0].Protocol != "tcp" {
				t.Errorf("ports %+v", p.ports)
			}
			if got := fileOf(p, p.sb.ResolvConfPath); got != "search ns.svc\nnameserver 10.96.0.10\n" {
				t.Errorf("resolv.conf %q", got)
			}
		},
	}, {
		name: "no hostname",
		edit: func(c *runtime.PodSandboxConfig) {
			c.Hostname, c.Metadata.Name = "", strings.Repeat("a", 62)+"-x"
		},
		check: func(t *testing.T, p *podPlan) {
			if p.ns.hostname != strings.Repeat("a", 62) {
				t.Errorf("hostname %q", p.ns.hostname)
			}
		},
	}, {
		name: "cgroup parent a slice",
		edit: func(c *runtime.PodSandboxConfig) { c.Linux.CgroupParent = "kubepods-burstable-pod1.slice" },
		check: func(t *testing.T, p *podPlan) {
			if want := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/pod-abc"; p.sb.CgroupParent != want {
				t.Errorf("cgroup %q, want %q", p.sb.CgroupParent, want)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := podCfg(tc.edit)
			p, err := planPod(testHost(), cfg, "runc")
			if err != nil {
				t.Fatal(err)
			}
			if p.sb.Config == cfg {
				t.Error("the plan shares the caller's config")
			}
			tc.check(t, p)
		})
	}
}

func TestPlanPodRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*runtime.PodSandboxConfig)
		host func(*planHost)
		want error
	}{
		{name: "no metadata", edit: func(c *runtime.PodSandboxConfig) { c.Metadata = nil }, want: errdefs.ErrInvalidArgument},
		{name: "no uid", edit: func(c *runtime.PodSandboxConfig) { c.Metadata.Uid = "" }, want: errdefs.ErrInvalidArgument},
		{name: "relative log directory", edit: func(c *runtime.PodSandboxConfig) { c.LogDirectory = "logs" }, want: errdefs.ErrInvalidArgument},
		{name: "hostname too long", edit: func(c *runtime.PodSandboxConfig) { c.Hostname = strings.Repeat("h", 65) }, want: errdefs.ErrInvalidArgument},
		{name: "net sysctl on the host network", edit: func(c *runtime.PodSandboxConfig) {
			nsOpts(c).Network = runtime.NamespaceMode_NODE
			c.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"}
		}, want: errdefs.ErrInvalidArgument},
		{name: "IPC sysctl on the host IPC", edit: func(c *runtime.PodSandboxConfig) {
			nsOpts(c).Ipc = runtime.NamespaceMode_NODE
			c.Linux.Sysctls = map[string]string{"kernel.shmmax": "1"}
		}, want: errdefs.ErrInvalidArgument},
		{name: "sysctl not namespaced", edit: func(c *runtime.PodSandboxConfig) { c.Linux.Sysctls = map[string]string{"vm.swappiness": "1"} }, want: errdefs.ErrInvalidArgument},
		{name: "user namespace with host IPC", edit: func(c *runtime.PodSandboxConfig) {
			nsOpts(c).UsernsOptions, nsOpts(c).Ipc = userNS(100000), runtime.NamespaceMode_NODE
		}, want: errdefs.ErrInvalidArgument},
		{name: "user namespace with host PID", edit: func(c *runtime.PodSandboxConfig) {
			nsOpts(c).UsernsOptions, nsOpts(c).Pid = userNS(100000), runtime.NamespaceMode_NODE
		}, want: errdefs.ErrInvalidArgument},
		{name: "user namespace mapping not from 0", edit: func(c *runtime.PodSandboxConfig) {
			u := userNS(100000)
			u.Uids[0] = &runtime.IDMapping{HostId: 100000, ContainerId: 1, Length: 10}
			nsOpts(c).UsernsOptions = u
		}, want: errdefs.ErrInvalidArgument},
		{name: "user namespaces unsupported", edit: func(c *runtime.PodSandboxConfig) { nsOpts(c).UsernsOptions = userNS(100000) },
			host: func(h *planHost) { h.usernsSupport = func() error { return errors.New("no idmapped mounts") } }, want: errdefs.ErrFailedPrecondition},
		{name: "no berth-pause", edit: func(c *runtime.PodSandboxConfig) { nsOpts(c).Pid = runtime.NamespaceMode_POD },
			host: func(h *planHost) {
				h.pauseBinary = func() (string, error) { return "", fmt.Errorf("no berth-pause: %w", errdefs.ErrFailedPrecondition) }
			}, want: errdefs.ErrFailedPrecondition},
		{name: "host port out of range", edit: func(c *runtime.PodSandboxConfig) {
			c.PortMappings = []*runtime.PortMapping{{ContainerPort: 80, HostPort: 70000}}
		}, want: errdefs.ErrInvalidArgument},
		{name: "bad host IP", edit: func(c *runtime.PodSandboxConfig) {
			c.PortMappings = []*runtime.PortMapping{{ContainerPort: 80, HostPort: 80, HostIp: "nope"}}
		}, want: errdefs.ErrInvalidArgument},
		{name: "cgroup parent not a slice", edit: func(c *runtime.PodSandboxConfig) { c.Linux.CgroupParent = "-kubepods.slice" }, want: errdefs.ErrInvalidArgument},
		{name: "systemd without a connection", host: func(h *planHost) { h.noSystemd = true }, want: errdefs.ErrFailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHost()
			if tc.host != nil {
				tc.host(h)
			}
			p, err := planPod(h, podCfg(tc.edit), "runc")
			if !errors.Is(err, tc.want) {
				t.Fatalf("planPod: %v, plan %+v; want %v", err, p, tc.want)
			}
			t.Log(err)
		})
	}
}

// A draft undoes its steps last first, once, and not at all once
// committed.
func TestDraftDiscardOrder(t *testing.T) {
	var got []int
	d := &podDraft{}
	for i := range 3 {
		d.done(func(context.Context) { got = append(got, i) })
	}
	d.discard(t.Context())
	d.discard(t.Context())
	if !slices.Equal(got, []int{2, 1, 0}) {
		t.Errorf("undo order %v, want [2 1 0]", got)
	}
	got = nil
	d = &podDraft{}
	d.done(func(context.Context) { got = append(got, 0) })
	d.committed = true
	d.discard(t.Context())
	if got != nil {
		t.Errorf("a committed draft was undone: %v", got)
	}
}
