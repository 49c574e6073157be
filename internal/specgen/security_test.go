package specgen

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/userns"
)

func TestCapabilities(t *testing.T) {
	all := knownCapabilities
	without := func(list []string, drop ...string) []string {
		return slices.DeleteFunc(slices.Clone(list), func(c string) bool { return slices.Contains(drop, c) })
	}
	for _, tc := range []struct {
		name      string
		add, drop []string
		nilCaps   bool
		want      []string
		err       error
	}{
		{name: "nil is the default set", nilCaps: true, want: defaultCapabilities},
		{name: "add plain and prefixed", add: []string{"sys_admin", "CAP_NET_ADMIN"},
			want: append(slices.Clone(defaultCapabilities), "CAP_SYS_ADMIN", "CAP_NET_ADMIN")},
		{name: "drop", drop: []string{"CHOWN", "cap_kill"}, want: without(defaultCapabilities, "CAP_CHOWN", "CAP_KILL")},
		{name: "add ALL", add: []string{"ALL"}, want: all},
		{name: "add ALL drop one", add: []string{"all"}, drop: []string{"SYS_ADMIN"}, want: without(all, "CAP_SYS_ADMIN")},
		{name: "drop ALL", drop: []string{"ALL"}, want: []string{}},
		{name: "drop ALL add one", drop: []string{"ALL"}, add: []string{"NET_BIND_SERVICE"}, want: []string{"CAP_NET_BIND_SERVICE"}},
		{name: "add existing no dup", add: []string{"CHOWN"}, want: defaultCapabilities},
		{name: "unknown name", add: []string{"FLY"}, err: errInvalid},
		{name: "unknown drop", drop: []string{"CAP_FLY"}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *runtime.Capability
			if !tc.nilCaps {
				c = &runtime.Capability{AddCapabilities: tc.add, DropCapabilities: tc.drop}
			}
			got, err := capabilities(c, all)
			wantErr(t, err, tc.err)
			if tc.err == nil && !slices.Equal(got, tc.want) {
				t.Fatalf("caps = %q, want %q", got, tc.want)
			}
		})
	}
	// A capability the kernel lacks cannot be granted.
	if _, err := capabilities(&runtime.Capability{AddCapabilities: []string{"BPF"}}, knownCapabilities[:38]); err == nil {
		t.Fatal("CAP_BPF granted on a kernel without it")
	}
}

func TestMaskedPaths(t *testing.T) {
	for _, tc := range []struct {
		name          string
		masked, ro    []string
		userns        bool
		wantM, wantRO []string
		err           error
	}{
		{name: "defaults", wantM: defaultMaskedPaths, wantRO: defaultReadonlyPaths},
		// The kubelet's procMount: Unmasked: both lists empty, so unset on the wire.
		{name: "unset in a user namespace pod masks nothing", userns: true, wantM: []string{}, wantRO: []string{}},
		// The kubelet's default procMount sends its lists in any pod.
		{name: "given in a user namespace pod", userns: true, masked: []string{"/proc/kcore"}, ro: []string{"/proc/sys"},
			wantM: []string{"/proc/kcore"}, wantRO: []string{"/proc/sys"}},
		{name: "one list given in a user namespace pod", userns: true, masked: []string{"/proc/kcore"}, wantM: []string{"/proc/kcore"}, wantRO: []string{}},
		{name: "override", masked: []string{"/bin/ls"}, ro: []string{"/tmp"}, wantM: []string{"/bin/ls"}, wantRO: []string{"/tmp"}},
		{name: "empty lists mask nothing", masked: []string{}, ro: []string{}, wantM: []string{}, wantRO: []string{}},
		{name: "relative", masked: []string{"proc"}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			sc(&in).MaskedPaths, sc(&in).ReadonlyPaths = tc.masked, tc.ro
			if tc.userns {
				in.Pod.UserNS = &userns.Mapping{UID: userns.IDMap{HostID: 1000, Size: 65536}, GID: userns.IDMap{HostID: 1000, Size: 65536}}
			}
			s := &specs.Spec{Linux: &specs.Linux{}}
			err := applyMaskedPaths(&in, s)
			wantErr(t, err, tc.err)
			if tc.err == nil && (!slices.Equal(s.Linux.MaskedPaths, tc.wantM) || !slices.Equal(s.Linux.ReadonlyPaths, tc.wantRO)) {
				t.Fatalf("masked %q ro %q", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
			}
		})
	}
}

func TestPrivileged(t *testing.T) {
	in := testInput(t)
	sc(&in).Privileged = true
	sc(&in).Seccomp = &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
	sc(&in).Capabilities = &runtime.Capability{DropCapabilities: []string{"ALL"}}
	if _, err := Build(in); err == nil {
		t.Fatal("privileged container allowed in an unprivileged pod")
	}
	in.SandboxConfig.Linux.SecurityContext.Privileged = true
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Process.Capabilities.Bounding, knownCapabilities) {
		t.Fatalf("privileged caps = %q", s.Process.Capabilities.Bounding)
	}
	if s.Linux.MaskedPaths != nil || s.Linux.ReadonlyPaths != nil || s.Linux.Seccomp != nil {
		t.Fatalf("privileged kept masks or seccomp: %q %q %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths, s.Linux.Seccomp != nil)
	}
	if r := s.Linux.Resources.Devices; len(r) != 1 || !r[0].Allow || r[0].Access != "rwm" {
		t.Fatalf("device rules = %+v, want allow all", r)
	}
	if !slices.ContainsFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return d.Path == "/dev/null" }) {
		t.Fatalf("host devices missing: %+v", s.Linux.Devices)
	}
	if m := findMount(s.Mounts, "/sys"); !slices.Contains(m.Options, "rw") {
		t.Fatalf("/sys = %+v, want rw", m)
	}
}

func TestSeccomp(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{not json`), 0o644); err != nil {
		t.Fatal(err)
	}
	prof := func(t runtime.SecurityProfile_ProfileType, ref string) *runtime.SecurityProfile {
		return &runtime.SecurityProfile{ProfileType: t, LocalhostRef: ref}
	}
	for _, tc := range []struct {
		name    string
		profile *runtime.SecurityProfile
		legacy  string
		want    string // "" none, "default", "local"
		err     error
	}{
		{name: "nil is unconfined"},
		{name: "unconfined", profile: prof(runtime.SecurityProfile_Unconfined, "")},
		{name: "runtime default", profile: prof(runtime.SecurityProfile_RuntimeDefault, ""), want: "default"},
		{name: "localhost", profile: prof(runtime.SecurityProfile_Localhost, good), want: "local"},
		{name: "localhost missing", profile: prof(runtime.SecurityProfile_Localhost, filepath.Join(dir, "nope.json")), err: errInvalid},
		{name: "localhost relative", profile: prof(runtime.SecurityProfile_Localhost, "x.json"), err: errInvalid},
		{name: "localhost bad json", profile: prof(runtime.SecurityProfile_Localhost, bad), err: errInvalid},
		{name: "ref on non-localhost", profile: prof(runtime.SecurityProfile_RuntimeDefault, good), err: errInvalid},
		{name: "legacy runtime/default", legacy: "runtime/default", want: "default"},
		{name: "legacy docker/default", legacy: "docker/default", want: "default"},
		{name: "legacy unconfined", legacy: "unconfined"},
		{name: "legacy localhost", legacy: "localhost/" + good, want: "local"},
		{name: "legacy garbage", legacy: "whatever", err: errInvalid},
		{name: "new field wins over legacy", profile: prof(runtime.SecurityProfile_Unconfined, ""), legacy: "runtime/default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			//lint:ignore SA1019 the deprecated field is still sent by older kubelets and critest
			sc(&in).Seccomp, sc(&in).SeccompProfilePath = tc.profile, tc.legacy
			s, err := Build(in)
			wantErr(t, err, tc.err)
			if tc.err != nil {
				return
			}
			switch got := s.Linux.Seccomp; {
			case tc.want == "" && got != nil:
				t.Fatalf("seccomp set: %+v", got.DefaultAction)
			case tc.want == "default" && (got == nil || got.DefaultAction != specs.ActErrno || len(got.Syscalls) < 10):
				t.Fatalf("not the default profile: %+v", got)
			case tc.want == "local" && (got == nil || got.DefaultAction != specs.ActAllow || len(got.Syscalls) != 1):
				t.Fatalf("not the local profile: %+v", got)
			}
		})
	}
}

// The default profile allows some syscalls only with a capability: with
// CAP_SYS_ADMIN added, it must allow e.g. mount.
func TestSeccompDefaultFollowsCapabilities(t *testing.T) {
	allows := func(s *specs.Spec, name string) bool {
		for _, sc := range s.Linux.Seccomp.Syscalls {
			if sc.Action == specs.ActAllow && slices.Contains(sc.Names, name) {
				return true
			}
		}
		return false
	}
	in := testInput(t)
	sc(&in).Seccomp = &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if allows(s, "mount") {
		t.Fatal("default profile allows mount without CAP_SYS_ADMIN")
	}
	sc(&in).Capabilities = &runtime.Capability{AddCapabilities: []string{"SYS_ADMIN"}}
	if s, err = Build(in); err != nil {
		t.Fatal(err)
	}
	if !allows(s, "mount") {
		t.Fatal("default profile blocks mount with CAP_SYS_ADMIN")
	}
}

func TestLSM(t *testing.T) {
	prof := func(t runtime.SecurityProfile_ProfileType, ref string) *runtime.SecurityProfile {
		return &runtime.SecurityProfile{ProfileType: t, LocalhostRef: ref}
	}
	for _, tc := range []struct {
		name       string
		apparmor   *runtime.SecurityProfile
		legacy     string
		selinux    *runtime.SELinuxOption
		aaOn, seOn bool
		privileged bool
		profiles   AppArmorProfiles
		wantAA     string
		note       string // expected in the debug log
		err        error
	}{
		{name: "nothing"},
		{name: "runtime/default without AppArmor ignored", apparmor: prof(runtime.SecurityProfile_RuntimeDefault, ""), note: "AppArmor is not enabled"},
		{name: "legacy runtime/default without AppArmor ignored", legacy: "runtime/default", note: "AppArmor is not enabled"},
		{name: "unconfined", apparmor: prof(runtime.SecurityProfile_Unconfined, "")},
		{name: "localhost without AppArmor", apparmor: prof(runtime.SecurityProfile_Localhost, "myprof"), err: errInvalid},
		{name: "localhost with AppArmor", aaOn: true, apparmor: prof(runtime.SecurityProfile_Localhost, "myprof"), wantAA: "myprof"},
		{name: "legacy localhost with AppArmor", aaOn: true, legacy: "localhost/p2", wantAA: "p2"},
		{name: "runtime/default with AppArmor but no profiles refused", aaOn: true, apparmor: prof(runtime.SecurityProfile_RuntimeDefault, ""), err: errInvalid},
		{name: "runtime/default with AppArmor is berth's profile", aaOn: true, profiles: fakeProfiles{}, apparmor: prof(runtime.SecurityProfile_RuntimeDefault, ""), wantAA: "berth-default"},
		{name: "legacy runtime/default with AppArmor", aaOn: true, profiles: fakeProfiles{}, legacy: "runtime/default", wantAA: "berth-default"},
		{name: "runtime/default that fails to load", aaOn: true, profiles: fakeProfiles{err: errdefs.ErrFailedPrecondition}, apparmor: prof(runtime.SecurityProfile_RuntimeDefault, ""), err: errdefs.ErrFailedPrecondition},
		{name: "runtime/default privileged is unconfined", aaOn: true, profiles: fakeProfiles{}, privileged: true, apparmor: prof(runtime.SecurityProfile_RuntimeDefault, "")},
		{name: "localhost loaded", aaOn: true, profiles: fakeProfiles{}, apparmor: prof(runtime.SecurityProfile_Localhost, "myprof"), wantAA: "myprof"},
		{name: "localhost not loaded", aaOn: true, profiles: fakeProfiles{}, apparmor: prof(runtime.SecurityProfile_Localhost, "other"), err: errInvalid},
		{name: "runtime/default privileged with AppArmor", aaOn: true, privileged: true, apparmor: prof(runtime.SecurityProfile_RuntimeDefault, "")},
		{name: "bad legacy", legacy: "nonsense", err: errInvalid},
		{name: "selinux without SELinux ignored", selinux: &runtime.SELinuxOption{Level: "s0:c1,c2"}, note: "SELinux is not enabled"},
		{name: "selinux with SELinux refused", seOn: true, selinux: &runtime.SELinuxOption{Type: "t"}, err: errInvalid},
		{name: "empty selinux options", seOn: true, selinux: &runtime.SELinuxOption{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			var logs bytes.Buffer
			in.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			in.Host.AppArmor, in.Host.SELinux = tc.aaOn, tc.seOn
			in.AppArmor = tc.profiles
			c := sc(&in)
			//lint:ignore SA1019 the deprecated field is still sent by older kubelets and critest
			c.Apparmor, c.ApparmorProfile, c.SelinuxOptions, c.Privileged = tc.apparmor, tc.legacy, tc.selinux, tc.privileged
			s := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
			err := applyLSM(&in, s)
			wantErr(t, err, tc.err)
			if s.Process.ApparmorProfile != tc.wantAA {
				t.Fatalf("apparmor profile %q, want %q", s.Process.ApparmorProfile, tc.wantAA)
			}
			if tc.note != "" && !strings.Contains(logs.String(), tc.note) {
				t.Fatalf("no debug note %q in %q", tc.note, logs.String())
			}
		})
	}
}

// fakeProfiles is a node with "myprof" loaded whose default profile loads
// (or fails with err).
type fakeProfiles struct{ err error }

func (f fakeProfiles) Default() (string, error) {
	if f.err != nil {
		return "", f.err
	}
	return "berth-default", nil
}

func (f fakeProfiles) Loaded(name string) (bool, error) { return name == "myprof", nil }

func TestAmbientCapabilities(t *testing.T) {
	for _, tc := range []struct {
		name       string
		caps       *runtime.Capability
		privileged bool
		want       []string
		err        error
	}{
		{name: "none", caps: &runtime.Capability{}},
		{name: "in default set", caps: &runtime.Capability{AddAmbientCapabilities: []string{"net_bind_service", "CAP_NET_BIND_SERVICE"}},
			want: []string{"CAP_NET_BIND_SERVICE"}},
		{name: "added then ambient", caps: &runtime.Capability{AddCapabilities: []string{"NET_ADMIN"}, AddAmbientCapabilities: []string{"NET_ADMIN"}},
			want: []string{"CAP_NET_ADMIN"}},
		{name: "privileged keeps ambient", privileged: true, caps: &runtime.Capability{AddAmbientCapabilities: []string{"KILL"}},
			want: []string{"CAP_KILL"}},
		{name: "not in set", caps: &runtime.Capability{AddAmbientCapabilities: []string{"SYS_ADMIN"}}, err: errInvalid},
		{name: "dropped", caps: &runtime.Capability{DropCapabilities: []string{"KILL"}, AddAmbientCapabilities: []string{"KILL"}}, err: errInvalid},
		{name: "unknown", caps: &runtime.Capability{AddAmbientCapabilities: []string{"FLY"}}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Host.DevPath = t.TempDir()
			sc(&in).Capabilities, sc(&in).Privileged = tc.caps, tc.privileged
			in.SandboxConfig.Linux.SecurityContext.Privileged = tc.privileged
			s, err := Build(in)
			wantErr(t, err, tc.err)
			if tc.err != nil {
				return
			}
			c := s.Process.Capabilities
			if !slices.Equal(c.Ambient, tc.want) || !slices.Equal(c.Inheritable, tc.want) {
				t.Fatalf("ambient %q inheritable %q, want %q", c.Ambient, c.Inheritable, tc.want)
			}
		})
	}
}

func TestRefuseUnsupported(t *testing.T) {
	for name, mutate := range map[string]func(in *Input){
		"cdi without a registry": func(in *Input) { in.Config.CDIDevices = []*runtime.CDIDevice{{Name: "vendor.com/gpu=0"}} },
		"windows":                func(in *Input) { in.Config.Windows = &runtime.WindowsContainerConfig{} },
	} {
		t.Run(name, func(t *testing.T) {
			in := testInput(t)
			mutate(&in)
			_, err := Build(in)
			wantErr(t, err, errInvalid)
		})
	}
}
