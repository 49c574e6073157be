package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

func runBerthd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestConfigOutputRoundTrips(t *testing.T) {
	dir := t.TempDir()
	first, errOut, code := runBerthd(t, "config", "--config", filepath.Join(dir, "absent.toml"),
		"--root", "/srv/berth", "--cni-bin-dir", "/a,/b", "--cni-bin-dir", "/c", "--log-level", "debug")
	if code != 0 {
		t.Fatalf("berthd config: exit %d: %s", code, errOut)
	}
	path := filepath.Join(dir, "berth.toml")
	if err := os.WriteFile(path, []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	second, errOut, code := runBerthd(t, "config", "--config", path)
	if code != 0 {
		t.Fatalf("berthd config --config: exit %d: %s", code, errOut)
	}
	if first != second {
		t.Fatalf("config does not round-trip:\n--- first\n%s\n--- second\n%s", first, second)
	}
	for _, want := range []string{`root = "/srv/berth"`, `cni_bin_dirs = ["/a", "/b", "/c"]`, `log_level = "debug"`} {
		if !strings.Contains(first, want) {
			t.Errorf("config output lacks %s:\n%s", want, first)
		}
	}
}

func TestFlagsOverrideFileOnlyWhenSet(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "berth.toml")
	if err := os.WriteFile(path, []byte("root = \"/from/file\"\nstate = \"/state/file\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runBerthd(t, "config", "--config", path, "--state", "/state/flag")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, `root = "/from/file"`) {
		t.Errorf("unset flag overrode the file:\n%s", out)
	}
	if !strings.Contains(out, `state = "/state/flag"`) {
		t.Errorf("set flag did not override the file:\n%s", out)
	}
}

func TestBadConfigIsRefusedWithAClearMessage(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ file, want string }{
		"unknown key":   {"rooot = \"/x\"\n", "unknown keys: rooot"},
		"bad toml":      {"root = \n", "parse config"},
		"relative root": {"root = \"relative\"\n", "absolute path"},
		"bad listen":    {"listen = \"tcp://1.2.3.4:5\"\n", "unix://"},
		"bad level":     {"log_level = \"loud\"\n", "log_level"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".toml")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			_, errOut, code := runBerthd(t, "config", "--config", path)
			if code == 0 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want failure mentioning %q", code, errOut, tc.want)
			}
		})
	}
}

func TestUnknownCommandFails(t *testing.T) {
	if _, _, code := runBerthd(t, "frobnicate"); code == 0 {
		t.Fatal("unknown command succeeded")
	}
}

// The kubelet parses runtime_version with apimachinery's ParseSemantic
// and shows "berth://Unknown" when that fails; every build must parse.
func TestRuntimeVersionIsSemantic(t *testing.T) {
	for build, want := range map[string]string{
		"09cb355":             "0.1.0-dev+09cb355",
		"09cb355-dirty":       "0.1.0-dev+09cb355-dirty",
		"dev":                 "0.1.0-dev",
		"":                    "0.1.0-dev",
		"v0.2.0":              "0.2.0",
		"v0.2.0-3-g09cb355":   "0.2.0-3-g09cb355",
		"v1.2":                "0.1.0-dev+v1.2",
		"weird/branch_name!":  "0.1.0-dev+weird-branch-name-",
		"v0.2.0-rc.1+build.5": "0.2.0-rc.1+build.5",
	} {
		got := semver(build)
		if got != want {
			t.Errorf("semver(%q) = %q, want %q", build, got, want)
		}
		if _, err := utilversion.ParseSemantic(got); err != nil {
			t.Errorf("semver(%q) = %q: the kubelet cannot parse it: %v", build, got, err)
		}
	}
	out, _, code := runBerthd(t, "version")
	if code != 0 || !strings.HasPrefix(out, "berthd 0.1.0-dev") {
		t.Fatalf("berthd version: %q (exit %d)", out, code)
	}
}
