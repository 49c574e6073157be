package specgen

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestProcessArgs(t *testing.T) {
	for _, tc := range []struct {
		name                string
		entrypoint, cmd     []string
		command, args, want []string
		err                 error
	}{
		{name: "image only", entrypoint: []string{"/ep"}, cmd: []string{"a"}, want: []string{"/ep", "a"}},
		{name: "cri command drops image cmd", entrypoint: []string{"/ep"}, cmd: []string{"a"}, command: []string{"/c"}, want: []string{"/c"}},
		{name: "cri args replace image cmd", entrypoint: []string{"/ep"}, cmd: []string{"a"}, args: []string{"b"}, want: []string{"/ep", "b"}},
		{name: "cri command and args", entrypoint: []string{"/ep"}, cmd: []string{"a"}, command: []string{"/c"}, args: []string{"x"}, want: []string{"/c", "x"}},
		{name: "no entrypoint", cmd: []string{"sh", "-c", "true"}, want: []string{"sh", "-c", "true"}},
		{name: "empty entrypoint reset", entrypoint: []string{""}, cmd: []string{"sh"}, want: []string{"sh"}},
		{name: "args only", args: []string{"sh"}, want: []string{"sh"}},
		{name: "nothing", err: errInvalid},
		{name: "empty executable", command: []string{""}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Image.Config.Entrypoint, in.Image.Config.Cmd = tc.entrypoint, tc.cmd
			in.Config.Command, in.Config.Args = tc.command, tc.args
			got, err := processArgs(&in)
			wantErr(t, err, tc.err)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("args = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestProcessEnv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		image    []string
		config   []*runtime.KeyValue
		hostname string
		want     []string
		err      error
	}{
		{name: "image then config, later wins", image: []string{"PATH=/bin", "A=img", "B=img"},
			config:   []*runtime.KeyValue{{Key: "A", Value: []byte("cfg")}, {Key: "C", Value: []byte("x=y")}},
			hostname: "podhost",
			want:     []string{"PATH=/bin", "HOSTNAME=podhost", "A=cfg", "B=img", "C=x=y"}},
		{name: "default PATH and node hostname", want: []string{defaultPathEnv, "HOSTNAME=node1"}},
		{name: "config overrides HOSTNAME", hostname: "h", config: []*runtime.KeyValue{{Key: "HOSTNAME", Value: []byte("mine")}},
			want: []string{defaultPathEnv, "HOSTNAME=mine"}},
		{name: "empty key", config: []*runtime.KeyValue{{Key: "", Value: []byte("v")}}, err: errInvalid},
		{name: "key with =", config: []*runtime.KeyValue{{Key: "A=B", Value: []byte("v")}}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Image.Config.Env = tc.image
			in.Config.Envs = tc.config
			in.SandboxConfig.Hostname = tc.hostname
			got, err := processEnv(&in)
			wantErr(t, err, tc.err)
			if tc.err == nil && !slices.Equal(got, tc.want) {
				t.Fatalf("env = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWorkingDir(t *testing.T) {
	for _, tc := range []struct {
		name, config, image, want string
		err                       error
	}{
		{name: "config wins", config: "/cfg", image: "/img", want: "/cfg"},
		{name: "image", image: "/img/", want: "/img"},
		{name: "default root", want: "/"},
		{name: "relative", config: "rel", err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Config.WorkingDir, in.Image.Config.WorkingDir = tc.config, tc.image
			got, err := workingDir(&in)
			wantErr(t, err, tc.err)
			if got != tc.want {
				t.Fatalf("cwd = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestClampRlimits(t *testing.T) {
	hard := map[string]uint64{"RLIMIT_NOFILE": 4096}
	for _, tc := range []struct {
		name string
		in   []specs.POSIXRlimit
		want []specs.POSIXRlimit
		err  error
	}{
		{name: "none"},
		{name: "below hard kept", in: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 2048}},
			want: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 2048}}},
		{name: "above hard clamped", in: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1 << 20, Hard: 1 << 20}},
			want: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096}}},
		{name: "unknown hard passes", in: []specs.POSIXRlimit{{Type: "RLIMIT_CORE", Soft: 1, Hard: 2}},
			want: []specs.POSIXRlimit{{Type: "RLIMIT_CORE", Soft: 1, Hard: 2}}},
		{name: "unknown type", in: []specs.POSIXRlimit{{Type: "RLIMIT_BOGUS"}}, err: errInvalid},
		{name: "soft above hard", in: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 3, Hard: 2}}, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := clampRlimits(tc.in, hard)
			wantErr(t, err, tc.err)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("rlimits = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Build clamps the configured rlimits to berthd's hard limits only when
// it lacks CAP_SYS_RESOURCE (the kernel refuses to raise them then);
// with it, only open files are held to fs.nr_open.
func TestRlimitsClampedWithoutCapSysResource(t *testing.T) {
	want := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1 << 20, Hard: 1 << 30}, {Type: "RLIMIT_CORE", Soft: 1 << 30, Hard: 1 << 30}}
	for _, tc := range []struct {
		name string
		caps []string
		want []specs.POSIXRlimit
	}{
		{"with CAP_SYS_RESOURCE", knownCapabilities, []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1 << 20, Hard: 1 << 20}, want[1]}},
		{"without", slices.DeleteFunc(slices.Clone(knownCapabilities), func(c string) bool { return c == "CAP_SYS_RESOURCE" }),
			[]specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096}, {Type: "RLIMIT_CORE", Soft: 1 << 30, Hard: 1 << 30}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Host.AllCapabilities = tc.caps
			in.Host.NROpen = 1 << 20
			in.Rlimits = want
			s, err := Build(in)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.Process.Rlimits, tc.want) {
				t.Fatalf("rlimits %+v, want %+v", s.Process.Rlimits, tc.want)
			}
		})
	}
}

func TestOOMScoreAdj(t *testing.T) {
	for _, tc := range []struct {
		name        string
		adj         int64
		floor, want int
		err         error
	}{
		{name: "kept", adj: 500, floor: -999, want: 500},
		{name: "clamped to floor", adj: -998, floor: -500, want: -500},
		{name: "zero floor", adj: -1000, want: 0},
		{name: "out of range", adj: 1001, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Config.Linux.Resources = &runtime.LinuxContainerResources{OomScoreAdj: tc.adj}
			in.OOMScoreAdjFloor = tc.floor
			got, err := oomScoreAdj(&in)
			wantErr(t, err, tc.err)
			if got != tc.want {
				t.Fatalf("adj = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestApplyProcessFlags(t *testing.T) {
	in := testInput(t)
	in.Config.Tty = true
	sc(&in).NoNewPrivs = true
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Process.Terminal || !s.Process.NoNewPrivileges || s.Process.OOMScoreAdj == nil {
		t.Fatalf("process = %+v", s.Process)
	}
}
