package sandbox

import (
	"errors"
	"github.com/berthcri/berth/internal/objstore"
	"os"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/sysctl"
	"github.com/berthcri/berth/internal/systemd"
)

func TestPodCgroupPath(t *testing.T) {
	for _, tc := range []struct{ parent, def, want string }{
		{"", "berth", "/berth/pod-abc"},
		{"/kubepods/burstable/pod1", "berth", "/kubepods/burstable/pod1/pod-abc"},
		{"kubepods", "berth", "/kubepods/pod-abc"},
		{"kubepods-burstable-pod1.slice", "berth", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/pod-abc"},
	} {
		got, err := podCgroupPath(tc.parent, tc.def, "abc")
		if err != nil || got != tc.want {
			t.Errorf("podCgroupPath(%q) = %q, %v; want %q", tc.parent, got, err, tc.want)
		}
	}
	for _, bad := range []string{"-a.slice", "a--b.slice", "a-.slice"} {
		if _, err := podCgroupPath(bad, "berth", "abc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("podCgroupPath(%q): err %v, want InvalidArgument", bad, err)
		}
	}
}

func TestValidateSysctls(t *testing.T) {
	got, err := validateSysctls(map[string]string{"net/ipv4/ip_forward": "1", "kernel.shmmax": "100", "fs.mqueue.msg_max": "20",
		"net/ipv4/conf/eth0.100/forwarding": "1"}, false, false)
	if err != nil || got["net.ipv4.ip_forward"] != "1" || got["kernel.shmmax"] != "100" || len(got) != 4 ||
		got["net.ipv4.conf.eth0/100.forwarding"] != "1" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, tc := range []struct {
		key              string
		hostNet, hostIPC bool
	}{
		{"kernel.pid_max", false, false},
		{"vm.swappiness", false, false},
		{"net.ipv4.ip_forward", true, false},
		{"kernel.shmmax", false, true},
		{"kernel.domainname", true, false},
		{"kernel.hostname", false, false},
		{"net/ipv4/../../kernel/core_pattern", false, false},
		{"net.ipv4.ip_forward=1+kernel.core_pattern=|/x", false, false},
	} {
		if _, err := validateSysctls(map[string]string{tc.key: "1"}, tc.hostNet, tc.hostIPC); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("sysctl %s (hostNet %v hostIPC %v): err %v, want InvalidArgument", tc.key, tc.hostNet, tc.hostIPC, err)
		}
	}
}

// TestValidateSysctlsRefusesInjectedValues: CVE-2022-0811's '+'/'='
// smuggling of a second sysctl, and line breaks.
func TestValidateSysctlsRefusesInjectedValues(t *testing.T) {
	for _, v := range []string{"1+kernel.core_pattern=|/tmp/x", "1\nkernel.core_pattern=x", "a=b"} {
		if _, err := validateSysctls(map[string]string{"net.ipv4.ip_forward": v}, false, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("value %q: err %v, want InvalidArgument", v, err)
		}
	}
}

// TestSysctlPathOfADottedInterface: the slash form's dotted interface
// name is written to its own file, not one a level deeper.
func TestSysctlPathOfADottedInterface(t *testing.T) {
	got, err := validateSysctls(map[string]string{"net/ipv4/conf/eth0.100/forwarding": "1"}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	for key := range got {
		if p := "/proc/sys/" + sysctl.Path(key); p != "/proc/sys/net/ipv4/conf/eth0.100/forwarding" {
			t.Fatalf("written to %s", p)
		}
	}
}

func TestResolvConfContent(t *testing.T) {
	got, err := resolvConfContent(&runtime.DNSConfig{Servers: []string{"1.1.1.1"}, Searches: []string{"a.b", "b"}, Options: []string{"ndots:2", "edns0"}})
	want := "search a.b b\nnameserver 1.1.1.1\noptions ndots:2 edns0\n"
	if err != nil || string(got) != want {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
	got, err = resolvConfContent(&runtime.DNSConfig{})
	host, _ := os.ReadFile("/etc/resolv.conf")
	if err != nil || string(got) != string(host) {
		t.Fatalf("empty DNS config: got %q, want the host's %q", got, host)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	records := objstore.Records[record]{Dir: t.TempDir(), File: recordFile, Indent: true}
	dir := records.ObjectDir("id1")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "u", Attempt: 2},
		Labels:       map[string]string{"a": "b"},
		PortMappings: []*runtime.PortMapping{{ContainerPort: 80, HostPort: 8080}},
		Linux:        &runtime.LinuxPodSandboxConfig{Overhead: &runtime.LinuxContainerResources{MemoryLimitInBytes: 1 << 20}},
	}
	r := &entry{
		sb: Sandbox{ID: "id1", Config: cfg, RuntimeHandler: "runc", State: runtime.PodSandboxState_SANDBOX_READY,
			CreatedAt: time.Unix(100, 5).UTC(), NetNSPath: "/n", CgroupParent: "/berth/pod-id1"},
		pausePID: 42, pauseStart: 7,
		ports:      []network.PortMapping{{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"}},
		attachment: &network.Attachment{ConfList: []byte(`{"name":"x"}`), IPs: []string{"10.0.0.2", "fd00::2"}},
	}
	c, err := r.toRecord()
	if err != nil {
		t.Fatal(err)
	}
	if err := records.Save("id1", c); err != nil {
		t.Fatal(err)
	}
	c2, err := records.Load("id1")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c2.toEntry()
	if err != nil {
		t.Fatal(err)
	}
	sb := r2.sb
	if sb.ID != "id1" || sb.Config.Metadata.Attempt != 2 || sb.Config.Labels["a"] != "b" || sb.State != runtime.PodSandboxState_SANDBOX_READY ||
		!sb.CreatedAt.Equal(r.sb.CreatedAt) || sb.IP != "10.0.0.2" || len(sb.AdditionalIPs) != 1 || sb.PIDNSPath != "/proc/42/ns/pid" ||
		sb.Overhead.GetMemoryLimitInBytes() != 1<<20 || r2.ports[0].HostPort != 8080 || r2.pauseStart != 7 {
		t.Fatalf("round trip lost data: %+v", r2)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temp files left: %v", entries)
	}
	c2.Version = "v0"
	if _, err := c2.toEntry(); err == nil {
		t.Fatal("unknown record version accepted")
	}
}

func TestPodCgroupNameByDriver(t *testing.T) {
	fs := &Store{opts: Options{CgroupParent: "berth"}}
	unit, path, err := fs.podCgroupName("", "abc")
	if err != nil || unit != "" || path != "/berth/pod-abc" {
		t.Errorf("cgroupfs: %q %q %v", unit, path, err)
	}
	sd := &Store{opts: Options{CgroupParent: "berth", CgroupDriver: "systemd", Systemd: &systemd.Units{}}}
	for parent, want := range map[string]string{
		"":                              "berth-berthpod_abc.slice",
		"kubepods-burstable-pod1.slice": "kubepods-burstable-pod1-berthpod_abc.slice",
	} {
		unit, path, err := sd.podCgroupName(parent, "abc")
		if err != nil || unit != want || path != "" {
			t.Errorf("systemd, parent %q: %q %q %v; want unit %q", parent, unit, path, err, want)
		}
	}
	if _, _, err := sd.podCgroupName("/kubepods/burstable/pod1", "abc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("systemd with a cgroupfs parent: err %v, want InvalidArgument", err)
	}
}

func TestRunRefusesSystemdWithoutConnection(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Options{Root: dir + "/root", State: dir + "/state", CgroupDriver: "systemd", RuntimeHandlers: []string{"runc"}, DefaultRuntimeHandler: "runc"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Run(t.Context(), &runtime.PodSandboxConfig{Metadata: &runtime.PodSandboxMetadata{Name: "a", Namespace: "b", Uid: "c"}}, "")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Run: err %v, want FailedPrecondition", err)
	}
}
