// Package install tests make install, make uninstall and the Debian
// package (decision 3730) on this host, which has no systemd: the files
// each puts where, the default berth.toml changing nothing, the operator's
// own files left alone, and the package's maintainer scripts run by a real
// dpkg into a scratch root (install, upgrade, remove, purge). The same
// package under systemd, with a pod running through it, is the guest
// lane's deb part (hack/guest/payload-deb.sh).
package install

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// root is the checkout (hack/ and contrib/ live there).
var root = func() string {
	r, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return r
}()

var binaries = []string{"berthd", "berth-shim", "berth-lazy", "berth-pause", "berthctl"}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// bin is $BERTH_BIN_DIR (make test) or a directory the binaries are
// built into once.
func bin(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("BERTH_BIN_DIR"); d != "" {
		return d
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "berth-install-bin-")
		if binErr != nil {
			return
		}
		for _, name := range binaries {
			switch name {
			case "berth-lazy": // built beside berth-shim by BuildShim
			case "berth-shim":
				_, binErr = berthdtest.BuildShim(binDir)
			default:
				_, binErr = berthdtest.BuildCommand(binDir, name)
			}
			if binErr != nil {
				return
			}
		}
	})
	if binErr != nil {
		t.Fatalf("build the binaries: %v", binErr)
	}
	return binDir
}

// run runs a command in the checkout with env added, failing the test
// with its output on error; it returns stdout.
func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := tryRun(env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func tryRun(env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// files lists the regular files and symlinks under dir, relative to it.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// checkConfigChangesNothing checks that berth.toml is all comments and
// that berthd reads it as no file: the same effective configuration.
func checkConfigChangesNothing(t *testing.T, berthd, berthToml string) {
	t.Helper()
	for i, line := range strings.Split(readFile(t, berthToml), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			t.Errorf("%s line %d is not a comment: %q", berthToml, i+1, line)
		}
	}
	withFile := run(t, nil, berthd, "config", "--config", berthToml)
	without := run(t, nil, berthd, "config", "--config", filepath.Join(t.TempDir(), "absent.toml"))
	if withFile != without {
		t.Errorf("berthd config with the installed %s differs from its defaults:\n%s\nwant\n%s", berthToml, withFile, without)
	}
	// Every default key is shown, commented out.
	commented := readFile(t, berthToml)
	for _, line := range strings.Split(without, "\n") {
		if line != "" && !strings.Contains(commented, "# "+line+"\n") {
			t.Errorf("%s does not show the default %q", berthToml, line)
		}
	}
}

// TestMakeInstallUninstall installs into a DESTDIR and uninstalls from it,
// with and without the operator's own berth.toml and crictl.yaml there
// first, under /usr/local and /usr.
func TestMakeInstallUninstall(t *testing.T) {
	crictlYAML := readFile(t, filepath.Join(root, "contrib/crictl.yaml"))
	const ownToml = "log_level = \"debug\"\n"
	const ownCrictl = "runtime-endpoint: unix:///run/other.sock\n"
	for _, tc := range []struct {
		name    string
		prefix  string
		ownToml bool // an operator's berth.toml is there before install
		ownCtl  bool // and their crictl.yaml
	}{
		{name: "fresh", prefix: "/usr/local"},
		{name: "prefix /usr", prefix: "/usr"},
		{name: "operator's files kept", prefix: "/usr/local", ownToml: true, ownCtl: true},
		{name: "operator's crictl.yaml only", prefix: "/usr/local", ownCtl: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := t.TempDir()
			toml := filepath.Join(dest, "etc/berth/berth.toml")
			crictl := filepath.Join(dest, "etc/crictl.yaml")
			if tc.ownToml {
				writeFile(t, toml, ownToml)
			}
			if tc.ownCtl {
				writeFile(t, crictl, ownCrictl)
			}
			env := []string{"BIN=" + bin(t), "DESTDIR=" + dest, "PREFIX=" + tc.prefix}
			run(t, env, "hack/install.sh", "install")
			// Twice: a second install changes nothing the first wrote.
			run(t, env, "hack/install.sh", "install")

			p := strings.TrimPrefix(tc.prefix, "/")
			want := []string{"etc/berth/berth.toml", "etc/crictl.yaml", p + "/lib/systemd/system/berthd.service"}
			for _, b := range binaries {
				want = append(want, p+"/bin/"+b)
				fi, err := os.Stat(filepath.Join(dest, p, "bin", b))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != 0o755 {
					t.Errorf("%s: mode %v, want 0755", b, fi.Mode().Perm())
				}
			}
			slices.Sort(want)
			if got := files(t, dest); !slices.Equal(got, want) {
				t.Errorf("installed files:\n%v\nwant\n%v", got, want)
			}
			unit := readFile(t, filepath.Join(dest, p, "lib/systemd/system/berthd.service"))
			wantExec := "ExecStart=" + tc.prefix + "/bin/berthd --config /etc/berth/berth.toml\n"
			if !strings.Contains(unit, wantExec) || !strings.Contains(unit, "KillMode=process\n") {
				t.Errorf("unit lacks %q or KillMode=process:\n%s", wantExec, unit)
			}
			if tc.ownToml {
				if got := readFile(t, toml); got != ownToml {
					t.Errorf("install changed the operator's berth.toml to\n%s", got)
				}
			} else {
				checkConfigChangesNothing(t, filepath.Join(dest, p, "bin/berthd"), toml)
			}
			wantCrictl := crictlYAML
			if tc.ownCtl {
				wantCrictl = ownCrictl
			}
			if got := readFile(t, crictl); got != wantCrictl {
				t.Errorf("crictl.yaml after install:\n%s\nwant\n%s", got, wantCrictl)
			}

			run(t, env, "hack/install.sh", "uninstall")
			var left []string
			if tc.ownToml {
				left = append(left, "etc/berth/berth.toml")
			}
			if tc.ownCtl {
				left = append(left, "etc/crictl.yaml")
			}
			if got := files(t, dest); !slices.Equal(got, left) {
				t.Errorf("left after uninstall: %v, want %v", got, left)
			}
			if _, err := os.Stat(filepath.Join(dest, "etc/berth")); tc.ownToml != (err == nil) {
				t.Errorf("etc/berth after uninstall: %v (the operator's berth.toml there: %v)", err, tc.ownToml)
			}
		})
	}
}

// TestUninstallKeepsAnEditedConfig: a berth.toml the operator edited after
// install stays; one they left as installed goes.
func TestUninstallKeepsAnEditedConfig(t *testing.T) {
	dest := t.TempDir()
	env := []string{"BIN=" + bin(t), "DESTDIR=" + dest}
	run(t, env, "hack/install.sh", "install")
	toml := filepath.Join(dest, "etc/berth/berth.toml")
	edited := readFile(t, toml) + "log_level = \"debug\"\n"
	writeFile(t, toml, edited)
	run(t, env, "hack/install.sh", "uninstall")
	if got := files(t, dest); !slices.Equal(got, []string{"etc/berth/berth.toml"}) {
		t.Fatalf("left after uninstall: %v, want only the edited berth.toml", got)
	}
	if readFile(t, toml) != edited {
		t.Error("uninstall changed the edited berth.toml")
	}
}
