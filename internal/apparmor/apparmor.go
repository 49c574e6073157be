// Package apparmor makes berth's RuntimeDefault AppArmor profile
// ("berth-default", generated from profile.tmpl and loaded with
// apparmor_parser, as containerd and CRI-O load theirs) and tells whether
// a profile is loaded. docs/specgen.md.
package apparmor

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

// DefaultProfile is the name of berth's RuntimeDefault profile.
const DefaultProfile = "berth-default"

//go:embed profile.tmpl
var profileText string

var profileTemplate = template.Must(template.New("profile").Parse(profileText))

// Options locate the parser and the kernel's list of loaded profiles.
type Options struct {
	// Parser is apparmor_parser ("" → from PATH).
	Parser string
	// ProfilesPath lists loaded profiles ("" → securityfs's).
	ProfilesPath string
}

// Profiles loads berth's default profile on demand and looks profiles up.
type Profiles struct {
	opts Options
	// mu serialises loads: two creates must not run the parser twice.
	mu sync.Mutex
}

// New returns Profiles over opts.
func New(opts Options) *Profiles {
	if opts.Parser == "" {
		opts.Parser = "apparmor_parser"
	}
	if opts.ProfilesPath == "" {
		opts.ProfilesPath = "/sys/kernel/security/apparmor/profiles"
	}
	return &Profiles{opts: opts}
}

// params fill profile.tmpl.
type params struct {
	Name string
	// ABI3 declares the 3.0 policy ABI, which parsers before 3.0 do not
	// know.
	ABI3 bool
}

// Generate renders the default profile under name for a parser of the
// given major version.
func Generate(name string, parserMajor int) ([]byte, error) {
	var b bytes.Buffer
	if err := profileTemplate.Execute(&b, params{Name: name, ABI3: parserMajor >= 3}); err != nil {
		return nil, fmt.Errorf("render apparmor profile %s: %w", name, err)
	}
	return b.Bytes(), nil
}

// Loaded reports whether the kernel has a profile of that name.
func (p *Profiles) Loaded(name string) (bool, error) {
	f, err := os.Open(p.opts.ProfilesPath)
	if err != nil {
		return false, fmt.Errorf("read loaded apparmor profiles: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "<name> (<mode>)"; a name may hold spaces.
		line := sc.Text()
		if i := strings.LastIndex(line, " ("); i >= 0 && line[:i] == name {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read loaded apparmor profiles: %w", err)
	}
	return false, nil
}

// Default loads berth's default profile unless the kernel already has it
// (checked on every call: a reload of the host's AppArmor policy drops
// it) and returns its name.
func (p *Profiles) Default() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	loaded, err := p.Loaded(DefaultProfile)
	if err != nil {
		return "", err
	}
	if loaded {
		return DefaultProfile, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	major, err := parserMajor(ctx, p.opts.Parser)
	if err != nil {
		return "", err
	}
	text, err := Generate(DefaultProfile, major)
	if err != nil {
		return "", err
	}
	// -K: no cache (the profile is generated); -r: replace a stale one.
	cmd := exec.CommandContext(ctx, p.opts.Parser, "-Kr")
	cmd.Stdin = bytes.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("load apparmor profile %s: %v: %s: %w", DefaultProfile, err, bytes.TrimSpace(out), errdefs.ErrFailedPrecondition)
	}
	return DefaultProfile, nil
}

var versionRE = regexp.MustCompile(`version (\d+)\.`)

// parserMajor is apparmor_parser's major version.
func parserMajor(ctx context.Context, parser string) (int, error) {
	out, err := exec.CommandContext(ctx, parser, "--version").Output()
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("apparmor_parser is needed to load the default AppArmor profile: %v: %w", err, errdefs.ErrFailedPrecondition)
		}
		return 0, fmt.Errorf("%s --version: %w", parser, err)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("%s --version: no version in %q", parser, out)
	}
	return strconv.Atoi(string(m[1]))
}
