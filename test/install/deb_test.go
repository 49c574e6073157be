package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// buildDeb runs hack/deb.sh into dir with the given version ("" for the
// one it derives) and returns the .deb's path.
func buildDeb(t *testing.T, dir, version string) string {
	t.Helper()
	// gzip: xz takes minutes of a loaded 2-core machine.
	env := []string{"BIN=" + bin(t), "DEB_OUT=" + dir, "DEB_COMPRESS=gzip"}
	if version != "" {
		env = append(env, "DEB_VERSION="+version)
	}
	deb := strings.TrimSpace(run(t, env, "hack/deb.sh"))
	if _, err := os.Stat(deb); err != nil {
		t.Fatalf("hack/deb.sh printed %q: %v", deb, err)
	}
	return deb
}

// TestDebPackageContents builds the package and reads it back with
// dpkg-deb: its fields and dependencies, its exact file list, its one
// conffile, maintainer scripts with crictl.yaml filled in, and a berth.toml
// that changes nothing.
func TestDebPackageContents(t *testing.T) {
	dir := t.TempDir()
	version := strings.TrimSpace(run(t, []string{"BIN=" + bin(t)}, "hack/deb.sh", "version"))
	if out, err := tryRun(nil, "dpkg", "--compare-versions", version, "lt", version+"+upgrade"); err != nil {
		t.Fatalf("version %q does not sort below %q+upgrade: %v %s", version, version, err, out)
	}
	deb := buildDeb(t, dir, "")
	if !strings.HasSuffix(deb, "/berth_"+version+"_"+strings.TrimSpace(run(t, nil, "dpkg", "--print-architecture"))+".deb") {
		t.Errorf("package file %s: want berth_%s_<arch>.deb", deb, version)
	}

	for field, want := range map[string]string{
		"Package": "berth",
		"Version": version,
		"Depends": "runc | crun, containernetworking-plugins, iptables",
	} {
		if got := strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", deb, field)); got != want {
			t.Errorf("%s: %q, want %q", field, got, want)
		}
	}

	var got []string
	for _, line := range strings.Split(strings.TrimSpace(run(t, nil, "dpkg-deb", "-c", deb)), "\n") {
		f := strings.Fields(line)
		if !strings.HasPrefix(f[0], "d") {
			got = append(got, strings.TrimPrefix(f[len(f)-1], "./"))
		}
		if f[1] != "root/root" {
			t.Errorf("%s is owned by %s, want root/root", f[len(f)-1], f[1])
		}
	}
	slices.Sort(got)
	want := []string{
		"etc/berth/berth.toml",
		"usr/bin/berth-lazy", "usr/bin/berth-pause", "usr/bin/berth-shim", "usr/bin/berthctl", "usr/bin/berthd",
		"usr/lib/systemd/system/berthd.service",
		"usr/share/doc/berth/README.md", "usr/share/doc/berth/operations.md",
	}
	if !slices.Equal(got, want) {
		t.Errorf("package files:\n%v\nwant\n%v", got, want)
	}

	control := filepath.Join(dir, "control")
	run(t, nil, "dpkg-deb", "-e", deb, control)
	if got := readFile(t, filepath.Join(control, "conffiles")); got != "/etc/berth/berth.toml\n" {
		t.Errorf("conffiles: %q", got)
	}
	crictlYAML := readFile(t, filepath.Join(root, "contrib/crictl.yaml"))
	for _, s := range []string{"postinst", "postrm"} {
		body := readFile(t, filepath.Join(control, s))
		if strings.Contains(body, "@CRICTL_YAML@") || !strings.Contains(body, crictlYAML) {
			t.Errorf("%s does not carry contrib/crictl.yaml:\n%s", s, body)
		}
	}

	data := filepath.Join(dir, "data")
	run(t, nil, "dpkg-deb", "-x", deb, data)
	checkConfigChangesNothing(t, filepath.Join(data, "usr/bin/berthd"), filepath.Join(data, "etc/berth/berth.toml"))
	unit := readFile(t, filepath.Join(data, "usr/lib/systemd/system/berthd.service"))
	if !strings.Contains(unit, "ExecStart=/usr/bin/berthd --config /etc/berth/berth.toml\n") {
		t.Errorf("the package's unit does not start /usr/bin/berthd:\n%s", unit)
	}
}

// scratchRoot is a directory dpkg --root can install into: an empty dpkg
// database, and a busybox shell for the maintainer scripts, which dpkg
// runs chrooted there. No systemd and no deb-systemd-helper: the scripts
// do what they can without (the guest lane runs them under systemd).
func scratchRoot(t *testing.T) string {
	t.Helper()
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox (busybox-static, hack/install-deps.sh test): %v", err)
	}
	r := t.TempDir()
	for _, d := range []string{"bin", "dev", "etc", "tmp", "var/log", "var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The scripts send output to /dev/null.
	if err := unix.Mknod(filepath.Join(r, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(r, "var/lib/dpkg/status"), "")
	writeFile(t, filepath.Join(r, "var/lib/dpkg/available"), "")
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "cat", "cmp", "rm", "sed", "rmdir", "mkdir"} {
		if err := os.Symlink("busybox", filepath.Join(r, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// dpkgEnv: dpkg looks for ldconfig and start-stop-daemon in PATH.
var dpkgEnv = []string{"PATH=" + os.Getenv("PATH") + ":/usr/sbin:/sbin", "DEBIAN_FRONTEND=noninteractive"}

// status is dpkg's status and version of berth in root, "" when it has
// none.
func status(t *testing.T, r string) string {
	t.Helper()
	out, err := tryRun(dpkgEnv, "dpkg-query", "--admindir="+filepath.Join(r, "var/lib/dpkg"), "-W", "-f=${Status} ${Version}", "berth")
	if err != nil || strings.Contains(out, "not-installed") {
		return ""
	}
	return out
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// TestDebInstallUpgradeRemovePurge runs the package's life through a real
// dpkg into a scratch root (dpkg --root; --force-depends, the root has no
// runc): install, upgrade to a higher version, remove, purge, with and
// without an operator's /etc/crictl.yaml there first. Not into this host:
// its /usr/bin/berth-pause would be on every other test's PATH and its
// /etc/berth/berth.toml what every plain berthd and berthctl doctor read.
func TestDebInstallUpgradeRemovePurge(t *testing.T) {
	dir := t.TempDir()
	const v1, v2 = "0.0.1~test", "0.0.1~test+upgrade"
	deb1, deb2 := buildDeb(t, dir, v1), buildDeb(t, dir, v2)
	crictlYAML := readFile(t, filepath.Join(root, "contrib/crictl.yaml"))
	const ownCrictl = "runtime-endpoint: unix:///run/other.sock\n"
	for _, tc := range []struct {
		name   string
		ownCtl bool
	}{
		{name: "fresh node"},
		{name: "operator's crictl.yaml", ownCtl: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := scratchRoot(t)
			dpkg := func(args ...string) {
				t.Helper()
				run(t, dpkgEnv, "dpkg", append([]string{"--root=" + r, "--force-depends"}, args...)...)
			}
			at := func(p string) string { return filepath.Join(r, p) }
			crictl := at("etc/crictl.yaml")
			wantCrictl := crictlYAML
			if tc.ownCtl {
				writeFile(t, crictl, ownCrictl)
				wantCrictl = ownCrictl
			}

			dpkg("-i", deb1)
			if got := status(t, r); got != "install ok installed "+v1 {
				t.Fatalf("status after install: %q", got)
			}
			for _, b := range binaries {
				if !exists(at("usr/bin/" + b)) {
					t.Errorf("usr/bin/%s missing after install", b)
				}
			}
			if got := readFile(t, crictl); got != wantCrictl {
				t.Errorf("crictl.yaml after install:\n%s\nwant\n%s", got, wantCrictl)
			}
			toml := readFile(t, at("etc/berth/berth.toml"))

			dpkg("-i", deb2)
			if got := status(t, r); got != "install ok installed "+v2 {
				t.Fatalf("status after upgrade: %q", got)
			}
			if readFile(t, at("etc/berth/berth.toml")) != toml {
				t.Error("the upgrade changed berth.toml")
			}
			if got := readFile(t, crictl); got != wantCrictl {
				t.Errorf("crictl.yaml after upgrade:\n%s", got)
			}

			// berthd's state, which the package never ships: purge keeps it.
			writeFile(t, at("var/lib/berth/containers/c1/record.json"), "{}\n")

			dpkg("-r", "berth")
			if got := status(t, r); got != "deinstall ok config-files "+v2 {
				t.Fatalf("status after remove: %q", got)
			}
			for _, p := range []string{"usr/bin/berthd", "usr/bin/berth-shim", "usr/lib/systemd/system/berthd.service"} {
				if exists(at(p)) {
					t.Errorf("%s left after remove", p)
				}
			}
			if readFile(t, at("etc/berth/berth.toml")) != toml || readFile(t, crictl) != wantCrictl {
				t.Error("remove changed berth.toml or crictl.yaml")
			}

			dpkg("-P", "berth")
			if got := status(t, r); got != "" {
				t.Fatalf("status after purge: %q", got)
			}
			if exists(at("etc/berth")) {
				t.Errorf("etc/berth left after purge: %v", files(t, at("etc/berth")))
			}
			if got := exists(crictl); got != tc.ownCtl {
				t.Errorf("etc/crictl.yaml after purge: exists %v, want %v (the operator's is kept, ours goes)", got, tc.ownCtl)
			}
			if tc.ownCtl && readFile(t, crictl) != ownCrictl {
				t.Error("purge changed the operator's crictl.yaml")
			}
			if !exists(at("var/lib/berth/containers/c1/record.json")) {
				t.Error("purge removed /var/lib/berth")
			}
		})
	}
}
