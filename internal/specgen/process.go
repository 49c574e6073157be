package specgen

import (
	"bytes"
	"path"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// defaultPathEnv is PATH when neither the image nor the config sets one.
const defaultPathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// applyProcess fills args, env, cwd, terminal, rlimits, oom_score_adj and
// no_new_privs.
func applyProcess(in *Input, s *specs.Spec) error {
	args, err := processArgs(in)
	if err != nil {
		return err
	}
	env, err := processEnv(in)
	if err != nil {
		return err
	}
	cwd, err := workingDir(in)
	if err != nil {
		return err
	}
	hard := in.Host.RlimitHard
	if slices.Contains(in.Host.AllCapabilities, "CAP_SYS_RESOURCE") {
		// The kernel lets the runtime raise hard limits, the open
		// files' only up to fs.nr_open.
		hard = nil
		if in.Host.NROpen > 0 {
			hard = map[string]uint64{"RLIMIT_NOFILE": in.Host.NROpen}
		}
	}
	rlimits, err := clampRlimits(in.Rlimits, hard)
	if err != nil {
		return err
	}
	adj, err := oomScoreAdj(in)
	if err != nil {
		return err
	}
	s.Process.Args = args
	s.Process.Env = env
	s.Process.Cwd = cwd
	// Stdin and StdinOnce are the shim's business: it holds the pipes.
	s.Process.Terminal = in.Config.GetTty()
	s.Process.Rlimits = rlimits
	s.Process.OOMScoreAdj = &adj
	s.Process.NoNewPrivileges = in.Config.GetLinux().GetSecurityContext().GetNoNewPrivs()
	return nil
}

// processArgs merges the CRI command/args with the image entrypoint/cmd as
// containerd (and docker) do: a CRI command replaces the entrypoint and
// drops the image cmd; CRI args replace the image cmd.
func processArgs(in *Input) ([]string, error) {
	command, args := in.Config.GetCommand(), in.Config.GetArgs()
	img := in.Image.Config
	if len(command) == 0 {
		if len(args) == 0 {
			args = img.Cmd
		}
		// An entrypoint of [""] means "no entrypoint" (docker's reset).
		if len(img.Entrypoint) != 1 || img.Entrypoint[0] != "" {
			command = img.Entrypoint
		}
	}
	out := append(append([]string{}, command...), args...)
	if len(out) == 0 {
		return nil, invalid("no command specified: neither the container config nor the image has one")
	}
	if out[0] == "" {
		return nil, invalid("empty executable name in command %q", out)
	}
	return out, nil
}

// processEnv is PATH default, HOSTNAME, the image env, then the config env;
// a later value replaces an earlier one with the same key.
func processEnv(in *Input) ([]string, error) {
	hostname := in.SandboxConfig.GetHostname()
	if hostname == "" {
		hostname = in.Host.Hostname
	}
	env := []string{defaultPathEnv, "HOSTNAME=" + hostname}
	env = mergeEnv(env, in.Image.Config.Env)
	var cfg []string
	for _, kv := range in.Config.GetEnvs() {
		if kv.GetKey() == "" {
			return nil, invalid("environment variable with an empty name")
		}
		if strings.ContainsAny(kv.GetKey(), "=\x00") || bytes.Contains(kv.GetValue(), []byte{0}) {
			return nil, invalid("environment variable %q: name must not contain '=' or NUL, value must not contain NUL", kv.GetKey())
		}
		cfg = append(cfg, kv.GetKey()+"="+string(kv.GetValue()))
	}
	return mergeEnv(env, cfg), nil
}

// mergeEnv replaces or appends each KEY=value of add in env.
func mergeEnv(env, add []string) []string {
	index := make(map[string]int, len(env))
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		index[k] = i
	}
	for _, kv := range add {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			env[i] = kv
			continue
		}
		index[k] = len(env)
		env = append(env, kv)
	}
	return env
}

// workingDir is the config's, else the image's, else "/".
func workingDir(in *Input) (string, error) {
	cwd := in.Config.GetWorkingDir()
	if cwd == "" {
		cwd = in.Image.Config.WorkingDir
	}
	if cwd == "" {
		return "/", nil
	}
	if !path.IsAbs(cwd) {
		return "", invalid("working dir %q is not absolute", cwd)
	}
	return path.Clean(cwd), nil
}

// clampRlimits lowers each configured rlimit to the daemon's hard limit
// (nil: no clamping): the runtime cannot raise a hard limit without
// CAP_SYS_RESOURCE, and runc would fail the create.
func clampRlimits(want []specs.POSIXRlimit, hard map[string]uint64) ([]specs.POSIXRlimit, error) {
	var out []specs.POSIXRlimit
	for _, rl := range want {
		if _, ok := rlimitResources[rl.Type]; !ok {
			return nil, invalid("unknown rlimit %q", rl.Type)
		}
		if rl.Soft > rl.Hard {
			return nil, invalid("rlimit %s: soft %d above hard %d", rl.Type, rl.Soft, rl.Hard)
		}
		if limit, ok := hard[rl.Type]; ok {
			rl.Hard = min(rl.Hard, limit)
			rl.Soft = min(rl.Soft, limit)
		}
		out = append(out, rl)
	}
	return out, nil
}

// oomScoreAdj is the config's value, raised to the daemon's floor: without
// CAP_SYS_RESOURCE the kernel refuses anything lower than the daemon's own.
func oomScoreAdj(in *Input) (int, error) {
	adj := int(in.Config.GetLinux().GetResources().GetOomScoreAdj())
	if adj < -1000 || adj > 1000 {
		return 0, invalid("oom_score_adj %d outside [-1000, 1000]", adj)
	}
	return max(adj, in.OOMScoreAdjFloor), nil
}
