package hostprobe

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/oci"
)

// The OCI runtime's own CVEs (docs/security.md, "The OCI runtime") are
// fixed only by the runtime on the host: berth cannot close them, so it
// says when the runtime a handler runs predates the fix. Versions are
// upstream's; a distribution may have backported a fix into an older
// version string (Debian's runc 1.1.5+ds1-1+deb12u1 carries the
// CVE-2024-21626 fix), which is why this warns and never fails.

// RuntimeVersion is what an OCI runtime's `--version` says of itself:
// "runc version 1.1.12", "crun version 1.28".
type RuntimeVersion struct {
	Name    string // runc, crun, … (the first word of the first line)
	Version string // as printed: 1.1.5+ds1, 1.4.0-rc.3
	major   int
	minor   int
	patch   int
	pre     string // "" for a release; rc.3, rc93 …
}

// ParseRuntimeVersion reads the first line of `<runtime> --version`:
// "<name> version <major>.<minor>[.<patch>][-<pre>][+<build>]".
func ParseRuntimeVersion(out string) (RuntimeVersion, error) {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	f := strings.Fields(line)
	if len(f) < 3 || f[1] != "version" {
		return RuntimeVersion{}, fmt.Errorf("runtime version %q: want \"<name> version <x.y.z>\"", truncate(line, 80))
	}
	v := RuntimeVersion{Name: f[0], Version: f[2]}
	core, _, _ := strings.Cut(f[2], "+") // build metadata: 1.1.5+ds1
	core, v.pre, _ = strings.Cut(core, "-")
	parts := strings.Split(core, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return RuntimeVersion{}, fmt.Errorf("runtime version %q: not <major>.<minor>[.<patch>]", truncate(f[2], 40))
	}
	nums := [3]int{}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return RuntimeVersion{}, fmt.Errorf("runtime version %q: not <major>.<minor>[.<patch>]", truncate(f[2], 40))
		}
		nums[i] = n
	}
	v.major, v.minor, v.patch = nums[0], nums[1], nums[2]
	return v, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// compare orders versions as semver does: a pre-release before its
// release; rc.3 and rc3 by their number.
func (v RuntimeVersion) compare(w RuntimeVersion) int {
	for _, d := range []int{v.major - w.major, v.minor - w.minor, v.patch - w.patch} {
		if d != 0 {
			return sign(d)
		}
	}
	switch {
	case v.pre == w.pre:
		return 0
	case v.pre == "":
		return 1
	case w.pre == "":
		return -1
	}
	vn, vok := preNumber(v.pre)
	wn, wok := preNumber(w.pre)
	if vok && wok {
		return sign(vn - wn)
	}
	return strings.Compare(v.pre, w.pre)
}

// preNumber reads rc.3, rc3 as 3.
func preNumber(pre string) (int, bool) {
	s := strings.TrimPrefix(strings.TrimPrefix(pre, "rc"), ".")
	n, err := strconv.Atoi(s)
	return n, err == nil && strings.HasPrefix(pre, "rc")
}

func sign(d int) int {
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// runtimeAdvisory is one fix of a runtime: its CVEs and the first fixed
// release of each release line that got it, oldest line first.
type runtimeAdvisory struct {
	runtime string
	cves    []string
	fixed   []string
}

// runtimeAdvisories are the runtime CVEs berth warns about, with the
// releases that fixed them (runc's CHANGELOG.md, crun's NEWS). A line
// without its own fix is open when a later line has one (runc 1.1 for
// the 2025 trio, 1.2 for CVE-2026-41579), fixed when it came after them
// all.
var runtimeAdvisories = []runtimeAdvisory{
	{runtime: "runc", cves: []string{"CVE-2024-21626"}, fixed: []string{"1.1.12"}},
	{runtime: "runc", cves: []string{"CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"}, fixed: []string{"1.2.8", "1.3.3", "1.4.0-rc.3"}},
	{runtime: "runc", cves: []string{"CVE-2026-41579"}, fixed: []string{"1.3.6", "1.4.3", "1.5.0-rc.3"}},
	// crun's NEWS names no fix for runc's 2025 trio; it names its own
	// /dev symlink fix (the class of runc's CVE-2026-41579).
	{runtime: "crun", cves: []string{"CVE-2026-47766"}, fixed: []string{"1.28"}},
}

func mustVersion(s string) RuntimeVersion {
	v, err := ParseRuntimeVersion("x version " + s)
	if err != nil {
		panic(err)
	}
	return v
}

// open tells whether v predates a's fix on its release line.
func (a runtimeAdvisory) open(v RuntimeVersion) bool {
	later := false
	for _, s := range a.fixed {
		f := mustVersion(s)
		if f.major == v.major && f.minor == v.minor {
			return v.compare(f) < 0
		}
		later = later || f.compare(v) > 0
	}
	return later
}

// OpenCVEs lists the runtime CVEs v's release predates, and the
// upstream releases that fix them (a "1.2.8, 1.3.3 or 1.4.0-rc.3" per
// advisory); none for a runtime berth knows no advisories of.
func (v RuntimeVersion) OpenCVEs() (cves []string, fixedIn []string) {
	for _, a := range runtimeAdvisories {
		if a.runtime == v.Name && a.open(v) {
			cves = append(cves, a.cves...)
			fixedIn = append(fixedIn, strings.Join(a.fixed, " / ")+" ("+strings.Join(a.cves, ", ")+")")
		}
	}
	return cves, fixedIn
}

// Warning is the operator's sentence about v, "" when v has no open
// advisory berth knows of.
func (v RuntimeVersion) Warning() string {
	cves, fixedIn := v.OpenCVEs()
	if len(cves) == 0 {
		return ""
	}
	return fmt.Sprintf("%s %s predates the upstream fixes of %s (fixed in %s); containers can use them against the host unless your distribution backported the fixes",
		v.Name, v.Version, strings.Join(cves, ", "), strings.Join(fixedIn, "; "))
}

// ProbeRuntimeVersion runs `<binary> --version` (bounded: a hung runtime
// must not hold up daemon start) and parses it.
func ProbeRuntimeVersion(ctx context.Context, binary string) (RuntimeVersion, string, error) {
	out, err := oci.Version(ctx, binary)
	if err != nil {
		return RuntimeVersion{}, "", err
	}
	v, err := ParseRuntimeVersion(out)
	return v, out, err
}

// WarnRuntimeVersions logs, once per runtime binary, the runtime CVEs
// the handlers' runtimes predate (berthd's start). A runtime whose
// version cannot be read is left to the features probe to report.
func WarnRuntimeVersions(ctx context.Context, runtimes map[string]*oci.Runtime, log *slog.Logger) {
	handlers := map[string][]string{}
	for name, rt := range runtimes {
		handlers[rt.Binary] = append(handlers[rt.Binary], name)
	}
	binaries := make([]string, 0, len(handlers))
	for b := range handlers {
		binaries = append(binaries, b)
	}
	sort.Strings(binaries)
	for _, b := range binaries {
		v, _, err := ProbeRuntimeVersion(ctx, b)
		if err != nil {
			log.Debug("runtime version unknown", "binary", b, "err", err)
			continue
		}
		if cves, _ := v.OpenCVEs(); len(cves) > 0 {
			sort.Strings(handlers[b])
			log.Warn("OCI runtime predates security fixes: "+v.Warning(), "binary", b, "handlers", handlers[b], "version", v.Version, "cves", cves)
		}
	}
}
