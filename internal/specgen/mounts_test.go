package specgen

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/userns"
)

// fakeMountinfo writes a mountinfo where dir is its own mount with the
// given optional fields ("shared:1", "master:2" or "").
func fakeMountinfo(t *testing.T, dir, optional string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mountinfo")
	lines := "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n" +
		"30 22 0:40 / " + strings.ReplaceAll(dir, " ", `\040`) + " rw,relatime " + optional + " - tmpfs tmpfs rw\n"
	if err := os.WriteFile(p, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func findMount(ms []specs.Mount, dst string) *specs.Mount {
	for i := range ms {
		if ms[i].Destination == dst {
			return &ms[i]
		}
	}
	return nil
}

func TestApplyMounts(t *testing.T) {
	type check func(t *testing.T, s *specs.Spec, host string)
	hasOpts := func(dst string, opts ...string) check {
		return func(t *testing.T, s *specs.Spec, _ string) {
			t.Helper()
			m := findMount(s.Mounts, dst)
			if m == nil {
				t.Fatalf("no mount at %s in %+v", dst, s.Mounts)
			}
			for _, o := range opts {
				if !slices.Contains(m.Options, o) {
					t.Fatalf("mount %s options %q lack %q", dst, m.Options, o)
				}
			}
		}
	}
	propagation := func(want string) check {
		return func(t *testing.T, s *specs.Spec, _ string) {
			t.Helper()
			if s.Linux.RootfsPropagation != want {
				t.Fatalf("rootfs propagation %q, want %q", s.Linux.RootfsPropagation, want)
			}
		}
	}
	for _, tc := range []struct {
		name       string
		mounts     func(host string) []*runtime.Mount
		optional   string // host mount's propagation in mountinfo
		rro        bool   // runtime supports rro
		privileged bool
		selinux    bool // the host runs SELinux
		err        error
		checks     []check
	}{
		{name: "defaults", checks: []check{
			hasOpts("/proc", "nosuid"), hasOpts("/dev", "mode=755"), hasOpts("/dev/pts", "newinstance"),
			hasOpts("/dev/mqueue"), hasOpts("/sys", "ro"), hasOpts("/sys/fs/cgroup", "ro"),
			hasOpts("/dev/shm", "mode=1777"), propagation(""),
			func(t *testing.T, s *specs.Spec, _ string) {
				if findMount(s.Mounts, "/run") != nil {
					t.Fatal("/run mounted: containerd drops it")
				}
			},
		}},
		{name: "privileged sysfs and cgroup rw", privileged: true, checks: []check{hasOpts("/sys", "rw"), hasOpts("/sys/fs/cgroup", "rw")}},
		// berth never relabels: relabelling a hostPath relabels host
		// files (CVE-2021-43816), so on an SELinux host it is refused,
		// and elsewhere it is a no-op (no relabel option reaches runc).
		{name: "selinux relabel refused on SELinux host", selinux: true, mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, SelinuxRelabel: true}}
		}, err: errInvalid},
		{name: "selinux relabel ignored without SELinux", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, SelinuxRelabel: true}}
		}, checks: []check{func(t *testing.T, s *specs.Spec, _ string) {
			m := findMount(s.Mounts, "/data")
			if m == nil || slices.ContainsFunc(m.Options, func(o string) bool { return o == "z" || o == "Z" || strings.HasPrefix(o, "context=") }) {
				t.Fatalf("relabel reached the spec: %+v", m)
			}
		}}},
		{name: "bind rw private", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h}}
		}, checks: []check{hasOpts("/data", "rbind", "rprivate", "rw"), propagation("")}},
		{name: "bind ro", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, Readonly: true}}
		}, checks: []check{hasOpts("/data", "ro")}},
		{name: "rslave on shared host mount", optional: "shared:5", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}}
		}, checks: []check{hasOpts("/data", "rslave"), propagation("rslave")}},
		{name: "rslave on slave host mount", optional: "master:5", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}}
		}, checks: []check{propagation("rslave")}},
		{name: "rslave on private host mount", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}}
		}, err: errdefs.ErrFailedPrecondition},
		{name: "rshared wins", optional: "shared:5", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{
				{ContainerPath: "/a", HostPath: h, Propagation: runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL},
				{ContainerPath: "/b", HostPath: h, Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
			}
		}, checks: []check{hasOpts("/a", "rshared"), propagation("rshared")}},
		{name: "rshared on slave host mount", optional: "master:5", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, Propagation: runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL}}
		}, err: errdefs.ErrFailedPrecondition},
		{name: "unknown propagation", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, Propagation: 9}}
		}, err: errInvalid},
		{name: "rro supported", rro: true, mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, Readonly: true, RecursiveReadOnly: true}}
		}, checks: []check{hasOpts("/a", "rro")}},
		{name: "rro unsupported by runtime", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, Readonly: true, RecursiveReadOnly: true}}
		}, err: errInvalid},
		{name: "rro without readonly", rro: true, mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, RecursiveReadOnly: true}}
		}, err: errInvalid},
		{name: "rro with rslave", rro: true, optional: "shared:1", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, Readonly: true, RecursiveReadOnly: true,
				Propagation: runtime.MountPropagation_PROPAGATION_HOST_TO_CONTAINER}}
		}, err: errInvalid},
		{name: "rro with rshared", rro: true, optional: "shared:1", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a", HostPath: h, Readonly: true, RecursiveReadOnly: true,
				Propagation: runtime.MountPropagation_PROPAGATION_BIDIRECTIONAL}}
		}, err: errInvalid},
		{name: "relative container path", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "data", HostPath: h}}
		}, err: errInvalid},
		{name: "relative host path", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: "data"}}
		}, err: errInvalid},
		{name: "image volume not mounted refused", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, Image: &runtime.ImageSpec{Image: "x"}}}
		}, err: errInvalid},
		{name: "idmapped without a copy made refused", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, UidMappings: []*runtime.IDMapping{{Length: 1}}}}
		}, err: errInvalid},
		{name: "mount options", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, MountOptions: []string{"noexec", "nosuid"}}}
		}, checks: []check{hasOpts("/data", "rbind", "noexec", "nosuid")}},
		{name: "unsafe mount option", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h, MountOptions: []string{"remount"}}}
		}, err: errInvalid},
		{name: "duplicate destination", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/d", HostPath: h}, {ContainerPath: "/d/", HostPath: h}}
		}, err: errInvalid},
		{name: "missing host path created", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: filepath.Join(h, "new/dir")}}
		}, checks: []check{func(t *testing.T, s *specs.Spec, h string) {
			fi, err := os.Stat(filepath.Join(h, "new/dir"))
			if err != nil || !fi.IsDir() {
				t.Fatalf("host path not created as a dir: %v", err)
			}
		}}},
		{name: "symlinked host path resolved", mounts: func(h string) []*runtime.Mount {
			_ = os.Symlink(h, h+"-link")
			t.Cleanup(func() { os.Remove(h + "-link") })
			return []*runtime.Mount{{ContainerPath: "/data", HostPath: h + "-link"}}
		}, checks: []check{func(t *testing.T, s *specs.Spec, h string) {
			if m := findMount(s.Mounts, "/data"); m == nil || m.Source != h {
				t.Fatalf("source not resolved: %+v", m)
			}
		}}},
		{name: "CRI mount replaces default", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/dev/shm", HostPath: h}}
		}, checks: []check{func(t *testing.T, s *specs.Spec, h string) {
			if m := findMount(s.Mounts, "/dev/shm"); m.Type != "bind" || m.Source != h {
				t.Fatalf("/dev/shm = %+v", m)
			}
		}}},
		{name: "CRI /dev drops default /dev mounts", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/dev", HostPath: h}}
		}, checks: []check{func(t *testing.T, s *specs.Spec, h string) {
			for _, m := range s.Mounts {
				if strings.HasPrefix(m.Destination, "/dev/") {
					t.Fatalf("default %s kept under a CRI /dev", m.Destination)
				}
			}
		}}},
		{name: "sorted by depth", mounts: func(h string) []*runtime.Mount {
			return []*runtime.Mount{{ContainerPath: "/a/b/c", HostPath: h}, {ContainerPath: "/a", HostPath: h}}
		}, checks: []check{func(t *testing.T, s *specs.Spec, h string) {
			ia := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/a" })
			ic := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/a/b/c" })
			if ia > ic {
				t.Fatalf("/a after /a/b/c: %+v", s.Mounts)
			}
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			host := t.TempDir()
			in.Host.MountInfoPath = fakeMountinfo(t, host, tc.optional)
			in.Host.RecursiveReadOnly = tc.rro
			in.Host.SELinux = tc.selinux
			sc(&in).Privileged = tc.privileged
			if tc.mounts != nil {
				in.Config.Mounts = tc.mounts(host)
			}
			s := &specs.Spec{Linux: &specs.Linux{}}
			in.Logger = discardLogger()
			err := applyMounts(&in, s)
			wantErr(t, err, tc.err)
			for _, c := range tc.checks {
				c(t, s, host)
			}
		})
	}
}

func TestPodFileMounts(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"hostname", "hosts", "resolv.conf", "own"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shm := t.TempDir()
	in := testInput(t)
	in.Logger = discardLogger()
	in.Pod.HostnamePath = filepath.Join(dir, "hostname")
	in.Pod.HostsPath = filepath.Join(dir, "hosts")
	in.Pod.ResolvConfPath = filepath.Join(dir, "missing") // skipped, as containerd
	in.Pod.ShmPath = shm
	sc(&in).ReadonlyRootfs = true
	in.Config.Mounts = []*runtime.Mount{{ContainerPath: "/etc/hosts", HostPath: filepath.Join(dir, "own")}}
	s := &specs.Spec{Linux: &specs.Linux{}}
	if err := applyMounts(&in, s); err != nil {
		t.Fatal(err)
	}
	if m := findMount(s.Mounts, "/etc/hostname"); m == nil || m.Source != in.Pod.HostnamePath || !slices.Contains(m.Options, "ro") {
		t.Fatalf("/etc/hostname = %+v (want the pod's, ro with a read-only rootfs)", m)
	}
	if m := findMount(s.Mounts, "/etc/hosts"); m == nil || m.Source != filepath.Join(dir, "own") {
		t.Fatalf("/etc/hosts = %+v, want the container's own", m)
	}
	if m := findMount(s.Mounts, "/etc/resolv.conf"); m != nil {
		t.Fatalf("missing resolv.conf mounted: %+v", m)
	}
	if m := findMount(s.Mounts, "/dev/shm"); m == nil || m.Source != shm || m.Type != "bind" {
		t.Fatalf("/dev/shm = %+v, want the pod's", m)
	} else if !slices.Contains(m.Options, "nosuid") || !slices.Contains(m.Options, "nodev") || !slices.Contains(m.Options, "noexec") {
		t.Fatalf("the pod's /dev/shm bind %v: want nosuid,nodev,noexec", m.Options)
	}

	// Host IPC (asked by the container or the pod) shares the host's /dev/shm.
	for _, set := range []func(){
		func() { sc(&in).NamespaceOptions = &runtime.NamespaceOption{Ipc: runtime.NamespaceMode_NODE} },
		func() {
			sc(&in).NamespaceOptions = nil
			in.SandboxConfig.Linux.SecurityContext.NamespaceOptions = &runtime.NamespaceOption{Ipc: runtime.NamespaceMode_NODE}
		},
	} {
		set()
		if err := applyMounts(&in, s); err != nil {
			t.Fatal(err)
		}
		if m := findMount(s.Mounts, "/dev/shm"); m == nil || m.Source != "/dev/shm" {
			t.Fatalf("host IPC /dev/shm = %+v", m)
		}
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\`: `/x\`, `/t\011`: "/t\t", `/n\9`: `/n\9`} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// A user namespace pod on the host's network cannot mount a sysfs (the
// kernel wants its user namespace to own the network namespace): its
// containers get the host's /sys bound recursively read-only, "rro"
// where the runtime takes it; every other pod a sysfs of its own.
func TestSysMountUserNamespaceHostNetwork(t *testing.T) {
	mapping := &userns.Mapping{UID: userns.IDMap{HostID: 1000, Size: 65536}, GID: userns.IDMap{HostID: 1000, Size: 65536}}
	for _, tc := range []struct {
		name         string
		userns       bool
		hostNet, rro bool
		privileged   bool
		want         specs.Mount
	}{
		{name: "pod network", want: specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}},
		{name: "host network", hostNet: true, want: specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}},
		{name: "user namespace", userns: true, want: specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}},
		{name: "user namespace host network rro", userns: true, hostNet: true, rro: true,
			want: specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "rro"}}},
		{name: "user namespace host network privileged", userns: true, hostNet: true, rro: true, privileged: true,
			want: specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "rro"}}},
		{name: "user namespace host network without rro", userns: true, hostNet: true,
			want: specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			if tc.userns {
				in.Pod.UserNS, in.Pod.UserNSPath = mapping, "/run/userns/p1"
			}
			if tc.hostNet {
				in.Pod.NetNSPath, in.Pod.UTSNSPath = "", ""
			}
			if tc.privileged {
				sc(&in).Privileged = true
				in.SandboxConfig.Linux.SecurityContext.Privileged = true
			}
			in.Host.RecursiveReadOnly = tc.rro
			s := &specs.Spec{Linux: &specs.Linux{}}
			if err := applyMounts(&in, s); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if tc.privileged && want.Type == "sysfs" {
				want.Options[3] = "rw"
			}
			if m := findMount(s.Mounts, "/sys"); m == nil || !reflect.DeepEqual(*m, want) {
				t.Fatalf("/sys = %+v, want %+v", m, want)
			}
		})
	}
}
