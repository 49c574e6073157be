package hostprobe

import (
	"reflect"
	"strings"
	"testing"
)

func TestRuntimeVersionOpenCVEs(t *testing.T) {
	trio := []string{"CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"}
	cat := func(xs ...[]string) []string {
		var out []string
		for _, x := range xs {
			out = append(out, x...)
		}
		return out
	}
	leaky := []string{"CVE-2024-21626"}
	dev := []string{"CVE-2026-41579"}
	for _, tc := range []struct {
		out  string
		want []string
	}{
		{"runc version 1.1.11\ncommit: v1.1.11-0\nspec: 1.0.2-dev\n", cat(leaky, trio, dev)},
		{"runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\n", cat(leaky, trio, dev)},
		{"runc version 1.0.0-rc93\n", cat(leaky, trio, dev)},
		{"runc version 1.1.12\n", cat(trio, dev)},
		{"runc version 1.2.0\n", cat(trio, dev)},
		{"runc version 1.2.7\n", cat(trio, dev)},
		{"runc version 1.2.8\n", dev},
		{"runc version 1.2.9\n", dev},
		{"runc version 1.3.2\n", cat(trio, dev)},
		{"runc version 1.3.3\n", dev},
		{"runc version 1.3.5\n", dev},
		{"runc version 1.3.6\n", nil},
		{"runc version 1.4.0-rc.2\n", cat(trio, dev)},
		{"runc version 1.4.0-rc.3\n", dev},
		{"runc version 1.4.0\n", dev},
		{"runc version 1.4.2\n", dev},
		{"runc version 1.4.3\n", nil},
		{"runc version 1.5.0-rc.2\n", dev},
		{"runc version 1.5.0-rc.3\n", nil},
		{"runc version 1.5.1\n", nil},
		{"runc version 2.0.0\n", nil},
		{"crun version 1.8.4\ncommit: 5a8fa99a5e41facba2eda4af12fa26313918805b\nrundir: /run/crun\n", []string{"CVE-2026-47766"}},
		{"crun version 1.27.1\n", []string{"CVE-2026-47766"}},
		{"crun version 1.28\n", nil},
		{"crun version 1.29.1\n", nil},
		{"youki version 0.3.0\n", nil},
	} {
		v, err := ParseRuntimeVersion(tc.out)
		if err != nil {
			t.Errorf("%q: %v", tc.out, err)
			continue
		}
		got, _ := v.OpenCVEs()
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: open CVEs %v, want %v", tc.out, got, tc.want)
		}
		if w := v.Warning(); (w == "") != (len(tc.want) == 0) {
			t.Errorf("%q: warning %q", tc.out, w)
		} else {
			for _, c := range tc.want {
				if !strings.Contains(w, c) {
					t.Errorf("%q: warning %q does not name %s", tc.out, w, c)
				}
			}
		}
	}
}

func TestParseRuntimeVersionRefusesOtherText(t *testing.T) {
	for _, out := range []string{"", "runc", "runc version", "runc 1.1.12", "runc version v1.1.12", "runc version 1", "runc version 1.2.3.4", "runc version 1.x.3", "runc version -1.2"} {
		if v, err := ParseRuntimeVersion(out); err == nil {
			t.Errorf("%q parsed as %+v", out, v)
		}
	}
}

func TestRuntimeVersionWarningNamesTheFixes(t *testing.T) {
	v, err := ParseRuntimeVersion("runc version 1.1.11")
	if err != nil {
		t.Fatal(err)
	}
	w := v.Warning()
	for _, want := range []string{"runc 1.1.11", "CVE-2024-21626", "1.1.12", "1.2.8 / 1.3.3 / 1.4.0-rc.3", "1.3.6 / 1.4.3 / 1.5.0-rc.3"} {
		if !strings.Contains(w, want) {
			t.Errorf("warning %q lacks %q", w, want)
		}
	}
}
