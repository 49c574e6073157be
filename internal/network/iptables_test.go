package network

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/netns"
	"github.com/berthcri/berth/internal/network/iptables"
	"github.com/berthcri/berth/internal/testutil/netnstest"
)

// savedText reads a save captured on a real node (iptables/testdata).
func savedText(t *testing.T, name string) []iptables.Table {
	t.Helper()
	b, err := os.ReadFile("iptables/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return iptables.Parse(string(b))
}

const testPod = "4f1c0e9a8b7d6c5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e"

func podTag(netName, podID string) func(string) bool {
	tag := `name: \"` + netName + `\" id: \"` + podID + `\"`
	return func(line string) bool { return strings.Contains(line, tag) }
}

// The scripts berth hands iptables-restore, from the saves of both
// families: the pod's rules (its masquerade chain and portmap's DNAT
// chain with them) and nothing of portmap's shared chains or the default
// network's masquerade; CRIU's lock with its jumps, not the rule whose
// comment reads like one.
func TestRestoreScriptsFromRealSaves(t *testing.T) {
	for _, tc := range []struct {
		file, podAddr, sub, mc string
	}{
		{"iptables-save.txt", "10.234.7.2/32", "10.234.7.0/24", "224.0.0.0/4"},
		{"ip6tables-save.txt", "fd00:b34:7::2/128", "fd00:b34:7::/64", "ff00::/8"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tables := savedText(t, tc.file)
			c := `-m comment --comment "name: \"dual\" id: \"` + testPod + `\""`
			want := "*nat\n" +
				"-D POSTROUTING -s " + tc.podAddr + " " + c + " -j CNI-0a1b2c3d4e5f60718293a4b5\n" +
				"-D CNI-0a1b2c3d4e5f60718293a4b5 -d " + tc.sub + " " + c + " -j ACCEPT\n" +
				"-D CNI-0a1b2c3d4e5f60718293a4b5 ! -d " + tc.mc + " " + c + " -j MASQUERADE\n" +
				"-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"dual\\\" id: \\\"" + testPod + "\\\"\" -m multiport --dports 8080 -j CNI-DN-0a1b2c3d4e5f60718293a\n" +
				"-F CNI-0a1b2c3d4e5f60718293a4b5\n-X CNI-0a1b2c3d4e5f60718293a4b5\n" +
				"-F CNI-DN-0a1b2c3d4e5f60718293a\n-X CNI-DN-0a1b2c3d4e5f60718293a\n" +
				"COMMIT\n"
			if got := natDeleteScript(tables, podTag("dual", testPod)); got != want {
				t.Errorf("nat delete script:\n%s\nwant:\n%s", got, want)
			}
			if got := natDeleteScript(tables, podTag("dual", "ffff")); got != "" {
				t.Errorf("another pod's script deletes:\n%s", got)
			}
			wantCRIU := "*filter\n-D INPUT -j CRIU\n-D OUTPUT -j CRIU\n-F CRIU\n-X CRIU\nCOMMIT\n"
			if got := criuUnlockScript(tables); got != wantCRIU {
				t.Errorf("CRIU unlock script:\n%s\nwant:\n%s", got, wantCRIU)
			}
		})
	}
	if got := criuUnlockScript(iptables.Parse("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n")); got != "" {
		t.Errorf("unlock script without a lock:\n%s", got)
	}
}

// lockAndTag adds, with the real iptables and ip6tables in the namespace
// pinned at pin, what a dual-stack pod's bridge plugin adds (a tagged
// masquerade jump and chain), a rule of portmap's shared chain, the
// default network's masquerade and CRIU's network lock.
func lockAndTag(t *testing.T, pin string) {
	t.Helper()
	tag := `name: "dual" id: "` + testPod + `"`
	err := netns.Do(pin, func() error {
		for _, f := range []struct{ prog, pod, sub string }{
			{"iptables", "10.234.7.2/32", "10.234.7.0/24"},
			{"ip6tables", "fd00:b34:7::2/128", "fd00:b34:7::/64"},
		} {
			for _, args := range [][]string{
				{"-t", "nat", "-N", "CNI-0a1b2c3d4e5f60718293a4b5"},
				{"-t", "nat", "-A", "POSTROUTING", "-s", f.pod, "-m", "comment", "--comment", tag, "-j", "CNI-0a1b2c3d4e5f60718293a4b5"},
				{"-t", "nat", "-A", "CNI-0a1b2c3d4e5f60718293a4b5", "-d", f.sub, "-m", "comment", "--comment", tag, "-j", "ACCEPT"},
				{"-t", "nat", "-N", "CNI-HOSTPORT-DNAT"},
				{"-t", "nat", "-A", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "CNI-HOSTPORT-DNAT"},
				{"-t", "nat", "-N", "BERTH-MASQ-bt7"},
				{"-t", "nat", "-A", "POSTROUTING", "-s", f.sub, "-j", "BERTH-MASQ-bt7"},
				{"-t", "filter", "-N", "CRIU"},
				{"-t", "filter", "-I", "INPUT", "-j", "CRIU"},
				{"-t", "filter", "-I", "OUTPUT", "-j", "CRIU"},
				{"-t", "filter", "-A", "CRIU", "-j", "DROP"},
			} {
				if b, err := exec.Command(f.prog, append([]string{"-w"}, args...)...).CombinedOutput(); err != nil {
					t.Errorf("%s %v: %v: %s", f.prog, args, err, b)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rulesIn lists the family's rules of one table in the namespace.
func rulesIn(t *testing.T, pin string, f iptables.Family, table string) (rules, chains string) {
	t.Helper()
	var tables []iptables.Table
	err := netns.Do(pin, func() error {
		var err error
		tables, err = iptables.Save(context.Background(), f, table)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var rs, cs []string
	for _, tb := range tables {
		cs = append(cs, tb.Chains...)
		for _, r := range tb.Rules {
			rs = append(rs, r.Line)
		}
	}
	return strings.Join(rs, "\n"), strings.Join(cs, " ")
}

// The orphan cleanup of a pod whose netns is gone (Detach) and CRIU's
// unlock, with the real iptables and ip6tables in a private network
// namespace: both families lose the pod's rules and CRIU's lock; the
// shared chains stay.
func TestOrphanRulesAndCRIULockGoInBothFamilies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, f := range iptables.Families() {
		if !f.Available() {
			t.Skipf("%s not available", f)
		}
	}
	pin := netnstest.New(t)
	lockAndTag(t, pin)
	ctx := context.Background()
	if err := netns.Do(pin, func() error { return removeOrphanRules(ctx, "dual", testPod) }); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCRIULock(ctx, pin); err != nil {
		t.Fatal(err)
	}
	for _, f := range iptables.Families() {
		rules, chains := rulesIn(t, pin, f, "nat")
		if strings.Contains(rules, testPod) || strings.Contains(chains, "CNI-0a1b") {
			t.Errorf("%s: the pod's nat rules survive:\n%s\nchains: %s", f, rules, chains)
		}
		if !strings.Contains(rules, "-j CNI-HOSTPORT-DNAT") || !strings.Contains(rules, "-j BERTH-MASQ-bt7") {
			t.Errorf("%s: shared nat rules removed:\n%s", f, rules)
		}
		rules, chains = rulesIn(t, pin, f, "filter")
		if strings.Contains(rules, "CRIU") || strings.Contains(chains, "CRIU") {
			t.Errorf("%s: CRIU's lock survives:\n%s\nchains: %s", f, rules, chains)
		}
	}
	// Nothing left to remove: both are no-ops.
	if err := netns.Do(pin, func() error { return removeOrphanRules(ctx, "dual", testPod) }); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCRIULock(ctx, pin); err != nil {
		t.Fatal(err)
	}
}
