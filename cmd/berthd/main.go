// Command berthd is the berth CRI runtime daemon.
//
//	berthd [flags]          serve CRI on --listen
//	berthd config [flags]   print the effective configuration as TOML
//	berthd config --running [flags]
//	                        print the configuration in effect in the berthd
//	                        serving --listen (after its reloads), and what
//	                        its last reload did
//	berthd version          print the version
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	modsemver "golang.org/x/mod/semver"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/daemon"
	"github.com/berthcri/berth/internal/fdsafe"
)

// version is set at build time with -ldflags "-X main.version=...":
// `git describe` output, a tag (v0.2.0) or a commit (09cb355-dirty).
var version = "dev"

// baseVersion is the release the tree is heading for; builds from a commit
// report it as a pre-release.
const baseVersion = "0.1.0"

// semver turns the build's version into a semantic version, which is what
// the kubelet parses VersionResponse.runtime_version as (a bare commit
// hash makes the node report "berth://Unknown"): a tag stays itself
// (v0.2.0 → 0.2.0), anything else becomes 0.1.0-dev+<build> with the
// commit kept as build metadata.
func semver(build string) string {
	v := strings.TrimPrefix(build, "v")
	if isSemver(v) {
		return v
	}
	meta := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, strings.Trim(build, "."))
	meta = strings.ReplaceAll(meta, "..", ".")
	if meta == "" || meta == "dev" {
		return baseVersion + "-dev"
	}
	return baseVersion + "-dev+" + meta
}

// isSemver accepts MAJOR.MINOR.PATCH with an optional pre-release and
// build part (git describe's v0.2.0-3-gabc1234 has the pre-release
// "3-gabc1234"); x/mod's shorthands (v1, v1.2) are not semantic versions.
func isSemver(v string) bool {
	core, _, _ := strings.Cut(v, "+")
	core, _, _ = strings.Cut(core, "-")
	return strings.Count(core, ".") == 2 && modsemver.IsValid("v"+v)
}

func main() {
	// Whatever berthd inherited beyond stdio must not reach the shim,
	// runc or a CNI plugin.
	fdsafe.CloseOnExecFrom3()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "version":
		fmt.Fprintf(stdout, "berthd %s\n", semver(version))
		return 0
	case "serve":
		// At once: SIGHUP's default action would kill berthd, and a
		// SIGHUP that comes while it starts is a reload to do once it
		// serves.
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		cfg, _, err := loadConfig(args, stderr)
		if err != nil {
			if err == flag.ErrHelp {
				return 0
			}
			fmt.Fprintf(stderr, "berthd: %v\n", err)
			return 2
		}
		return serve(cfg, args, hup, stderr)
	case "config":
	default:
		fmt.Fprintf(stderr, "berthd: unknown command %q (want serve, config or version)\n", cmd)
		return 2
	}
	running := false
	rest := args[:0:0]
	for _, a := range args {
		if a == "--running" || a == "-running" {
			running = true
			continue
		}
		rest = append(rest, a)
	}
	cfg, _, err := loadConfig(rest, stderr)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintf(stderr, "berthd: %v\n", err)
		return 2
	}
	if running {
		if err := printRunningConfig(cfg.Listen, stdout); err != nil {
			fmt.Fprintf(stderr, "berthd: %v\n", err)
			return 1
		}
		return 0
	}
	out, err := cfg.TOML()
	if err != nil {
		fmt.Fprintf(stderr, "berthd: %v\n", err)
		return 1
	}
	stdout.Write(out)
	return 0
}

// stringFlags are berthd's string flags: each sets one config key, and
// only when given (the file's value stays otherwise).
var stringFlags = []struct {
	name, usage string
	field       func(*config.Config) *string
}{
	{"listen", "CRI endpoint (unix:///path)", func(c *config.Config) *string { return &c.Listen }},
	{"root", "persistent state directory", func(c *config.Config) *string { return &c.Root }},
	{"state", "runtime state directory", func(c *config.Config) *string { return &c.State }},
	{"runtime", "default OCI runtime binary", func(c *config.Config) *string { return &c.Runtime }},
	{"cni-conf-dir", "CNI network config directory", func(c *config.Config) *string { return &c.CNIConfDir }},
	{"registry-config-dir", "registry hosts.toml directory", func(c *config.Config) *string { return &c.RegistryConfigDir }},
	{"streaming-address", "exec/attach/port-forward server address", func(c *config.Config) *string { return &c.StreamingAddress }},
	{"metrics-address", "Prometheus metrics address (empty: off)", func(c *config.Config) *string { return &c.MetricsAddress }},
	{"log-level", "debug, info, warn or error", func(c *config.Config) *string { return &c.LogLevel }},
	{"log-format", "text or json", func(c *config.Config) *string { return &c.LogFormat }},
	{"cgroup-driver", "cgroupfs or systemd (empty: cgroupfs; systemd needs a running systemd)", func(c *config.Config) *string { return &c.CgroupDriver }},
}

// loadConfig layers defaults, the TOML file and then only the flags the user
// actually set, so a flag's default never overrides a file value.
// It also returns the config file's path.
func loadConfig(args []string, stderr io.Writer) (*config.Config, string, error) {
	fs := flag.NewFlagSet("berthd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flagCfg := config.Default()
	configPath := fs.String("config", config.DefaultConfigPath, "TOML config file (absent file: defaults)")
	for _, f := range stringFlags {
		p := f.field(flagCfg)
		fs.StringVar(p, f.name, *p, f.usage)
	}
	fs.Var((*stringList)(&flagCfg.CNIBinDirs), "cni-bin-dir", "CNI plugin directory (repeat or comma-separate)")
	if err := fs.Parse(args); err != nil {
		return nil, "", err
	}
	if fs.NArg() > 0 {
		return nil, "", fmt.Errorf("unexpected arguments: %v", fs.Args())
	}

	cfg := config.Default()
	if err := config.LoadFile(cfg, *configPath); err != nil {
		return nil, "", err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, f := range stringFlags {
		if set[f.name] {
			*f.field(cfg) = *f.field(flagCfg)
		}
	}
	if set["cni-bin-dir"] {
		// The flag replaces the list; its first use drops the defaults.
		cfg.CNIBinDirs = flagCfg.CNIBinDirs[len(config.DefaultCNIBinDirs):]
	}
	if err := cfg.Validate(); err != nil {
		return nil, "", err
	}
	return cfg, *configPath, nil
}

// stringList is a repeatable, comma-separated list flag that appends.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func serve(cfg *config.Config, args []string, hup <-chan os.Signal, stderr io.Writer) int {
	level := new(slog.LevelVar)
	log := newLogger(cfg, level, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := daemon.New(ctx, cfg, semver(version), log)
	if err != nil {
		log.Error("berthd failed to start", "error", err)
		return 1
	}
	// A reload reads the configuration as the start did: the same file
	// and the same flags over it.
	d.EnableReload(func() (*config.Config, error) {
		var msgs strings.Builder
		c, path, err := loadConfig(args, &msgs)
		if err != nil && msgs.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(msgs.String()))
		}
		if err == nil {
			// At start a missing file means the defaults; at a reload it
			// is more likely a file being replaced than a wish to go
			// back to them.
			if _, serr := os.Stat(path); serr != nil {
				err = fmt.Errorf("read config %s: %w", path, serr)
			}
		}
		return c, err
	}, level)
	go func() {
		for {
			select {
			case <-hup:
				log.Info("SIGHUP: reloading the configuration")
				d.Reload(ctx)
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := d.Serve(ctx); err != nil {
		log.Error("berthd failed", "error", err)
		return 1
	}
	return 0
}

// newLogger logs at cfg's level, held in level so that a reload can
// change it.
func newLogger(cfg *config.Config, level *slog.LevelVar, w io.Writer) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(cfg.LogLevel))
	level.Set(l)
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
