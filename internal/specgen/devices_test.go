package specgen

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestApplyDevices(t *testing.T) {
	link := filepath.Join(t.TempDir(), "nulllink")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		devices []*runtime.Device
		want    []specs.LinuxDevice // Path, Type, Major, Minor only
		access  []string
		err     error
	}{
		{name: "none"},
		{name: "char device", devices: []*runtime.Device{{HostPath: "/dev/null", ContainerPath: "/dev/mynull", Permissions: "rw"}},
			want: []specs.LinuxDevice{{Path: "/dev/mynull", Type: "c", Major: 1, Minor: 3}}, access: []string{"rw"}},
		{name: "symlink followed, default permissions", devices: []*runtime.Device{{HostPath: link, ContainerPath: "/dev/x"}},
			want: []specs.LinuxDevice{{Path: "/dev/x", Type: "c", Major: 1, Minor: 3}}, access: []string{"rwm"}},
		{name: "container path defaults to host path", devices: []*runtime.Device{{HostPath: "/dev/zero", Permissions: "m"}},
			want: []specs.LinuxDevice{{Path: "/dev/zero", Type: "c", Major: 1, Minor: 5}}, access: []string{"m"}},
		{name: "missing", devices: []*runtime.Device{{HostPath: "/dev/does-not-exist", ContainerPath: "/dev/x"}}, err: errInvalid},
		{name: "not a device", devices: []*runtime.Device{{HostPath: "/etc/hostname", ContainerPath: "/dev/x"}}, err: errInvalid},
		{name: "bad permissions", devices: []*runtime.Device{{HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "rx"}}, err: errInvalid},
		{name: "repeated permission", devices: []*runtime.Device{{HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "rr"}}, err: errInvalid},
		{name: "relative container path", devices: []*runtime.Device{{HostPath: "/dev/null", ContainerPath: "x"}}, err: errInvalid},
		{name: "relative host path", devices: []*runtime.Device{{HostPath: "dev/null", ContainerPath: "/dev/x"}}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Config.Devices = tc.devices
			s := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{}}}
			err := applyDevices(&in, s)
			wantErr(t, err, tc.err)
			if tc.err != nil {
				return
			}
			if len(s.Linux.Devices) != len(tc.want) {
				t.Fatalf("devices = %+v, want %+v", s.Linux.Devices, tc.want)
			}
			rules := s.Linux.Resources.Devices
			if len(rules) != 1+len(tc.want) || rules[0].Allow || rules[0].Access != "rwm" {
				t.Fatalf("cgroup rules = %+v: want deny-all then one allow per device", rules)
			}
			for i, w := range tc.want {
				d := s.Linux.Devices[i]
				if d.Path != w.Path || d.Type != w.Type || d.Major != w.Major || d.Minor != w.Minor || d.FileMode == nil {
					t.Fatalf("device %d = %+v, want %+v", i, d, w)
				}
				r := rules[i+1]
				if !r.Allow || r.Type != w.Type || *r.Major != w.Major || *r.Minor != w.Minor || r.Access != tc.access[i] {
					t.Fatalf("rule %d = %+v", i, r)
				}
			}
		})
	}
}

func TestDeviceDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		name string
		mode uint32
		dev  int
	}{{"c0", unix.S_IFCHR | 0o600, int(unix.Mkdev(1, 3))}, {"sub/b0", unix.S_IFBLK | 0o660, int(unix.Mkdev(7, 9))}} {
		if err := unix.Mknod(filepath.Join(dir, n.name), n.mode, n.dev); err != nil {
			t.Skip("mknod:", err)
		}
		if err := os.Chmod(filepath.Join(dir, n.name), os.FileMode(n.mode&0o777)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "plain"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	devs, err := hostDevices(dir, "/dev/group")
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Path != "/dev/group/c0" || devs[1].Path != "/dev/group/sub/b0" ||
		devs[1].Type != "b" || devs[1].Major != 7 || devs[1].Minor != 9 || *devs[1].FileMode != 0o660 {
		t.Fatalf("devices = %+v", devs)
	}
}
