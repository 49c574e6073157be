package apparmor

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

// The generated profile compiles with the real apparmor_parser; -Q skips
// loading into the kernel (this node's kernel has no AppArmor).
func TestGeneratedProfileCompiles(t *testing.T) {
	parser, err := exec.LookPath("apparmor_parser")
	if err != nil {
		t.Skip("apparmor_parser not installed (Debian package apparmor)")
	}
	major, err := parserMajor(t.Context(), parser)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []int{major, 2} {
		text, err := Generate(DefaultProfile, m)
		if err != nil {
			t.Fatal(err)
		}
		if (m >= 3) != strings.Contains(string(text), "abi <abi/3.0>") {
			t.Fatalf("parser %d: abi line wrong:\n%s", m, text)
		}
		if m < 3 && major >= 3 {
			continue // an older parser's form; this parser wants the ABI
		}
		f := filepath.Join(t.TempDir(), DefaultProfile)
		if err := os.WriteFile(f, text, 0o644); err != nil {
			t.Fatal(err)
		}
		// -K: no cache; -o: write the compiled policy instead of loading it.
		compiled := f + ".bin"
		if out, err := exec.Command(parser, "-Q", "-K", "-o", compiled, f).CombinedOutput(); err != nil {
			t.Fatalf("apparmor_parser -Q: %v\n%s\n%s", err, out, text)
		}
		if fi, err := os.Stat(compiled); err != nil || fi.Size() == 0 {
			t.Fatalf("no compiled policy: %v", err)
		}
		if !strings.Contains(string(text), "profile "+DefaultProfile+" flags=") {
			t.Fatalf("profile name missing:\n%s", text)
		}
	}
}

// fakeParser is an apparmor_parser stand-in that records its arguments
// and stdin, and appends the profile to the fake kernel list.
func fakeParser(t *testing.T, profiles string) (parser, log string) {
	t.Helper()
	dir := t.TempDir()
	parser, log = filepath.Join(dir, "apparmor_parser"), filepath.Join(dir, "log")
	script := `#!/bin/sh
if [ "$1" = --version ]; then echo "AppArmor parser version 3.0.8"; exit 0; fi
echo "args: $*" >> ` + log + `
cat >> ` + log + `
echo "berth-default (enforce)" >> ` + profiles + `
`
	if err := os.WriteFile(parser, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return parser, log
}

func TestDefaultLoadsOnceAndOnlyWhenMissing(t *testing.T) {
	profiles := filepath.Join(t.TempDir(), "profiles")
	if err := os.WriteFile(profiles, []byte("docker-default (enforce)\nmy prof (complain)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parser, log := fakeParser(t, profiles)
	p := New(Options{Parser: parser, ProfilesPath: profiles})
	for _, tc := range []struct {
		name string
		want bool
	}{{"docker-default", true}, {"my prof", true}, {"my", false}, {DefaultProfile, false}} {
		if got, err := p.Loaded(tc.name); err != nil || got != tc.want {
			t.Fatalf("Loaded(%q) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	for range 2 {
		name, err := p.Default()
		if err != nil || name != DefaultProfile {
			t.Fatalf("Default() = %q, %v", name, err)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "args: -Kr"); n != 1 || !strings.Contains(string(data), "profile berth-default") {
		t.Fatalf("parser ran %d times, log:\n%s", n, data)
	}
}

func TestDefaultWithoutParserIsFailedPrecondition(t *testing.T) {
	profiles := filepath.Join(t.TempDir(), "profiles")
	os.WriteFile(profiles, nil, 0o644)
	p := New(Options{Parser: filepath.Join(t.TempDir(), "none"), ProfilesPath: profiles})
	if _, err := p.Default(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("err %v, want FailedPrecondition", err)
	}
	if _, err := New(Options{ProfilesPath: filepath.Join(t.TempDir(), "absent")}).Loaded("x"); err == nil {
		t.Fatal("no error without the kernel's profile list")
	}
}
