package iptables

import (
	"os"
	"strings"
	"testing"
)

// summary prints what Parse read, one table per block: its declared
// chains, then each rule as CHAIN>TARGET.
func summary(tables []Table) string {
	var b strings.Builder
	for _, t := range tables {
		b.WriteString("*" + t.Name + "\n:" + strings.Join(t.Chains, " :") + "\n")
		for _, r := range t.Rules {
			b.WriteString(r.Chain + ">" + r.Target + "\n")
		}
	}
	return b.String()
}

// The saves in testdata were captured on a real node (iptables v1.8.9,
// nf_tables) after adding, in a throwaway network namespace, what berth
// reads: a CNI bridge plugin's tagged masquerade chain, portmap's shared
// and per-pod DNAT chains, the default network's masquerade jump, an
// empty CNI chain, CRIU's network lock, a comment that reads like
// "-j CRIU", a goto and a rule with no target (testdata/capture.sh).
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		save string // "@file" reads testdata/file
		want string
	}{
		{"iptables-save", "@iptables-save.txt", wantV4},
		{"ip6tables-save", "@ip6tables-save.txt", wantV6},
		{"ip6tables-save -t nat", "@ip6tables-save-nat.txt", wantV6Nat},
		{"empty", "", ""},
		{"rules outside a table are skipped", "-A INPUT -j ACCEPT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n-A INPUT -j DROP\n", "*filter\n:INPUT\n"},
		{"a table not closed is kept", "*nat\n:X - [0:0]\n-A X -j MASQUERADE", "*nat\n:X\nX>MASQUERADE\n"},
		{"CRLF", "*nat\r\n:X - [0:0]\r\n-A X -j Y\r\nCOMMIT\r\n", "*nat\n:X\nX>Y\n"},
		{"a quoted -j is a comment, not a target", "*filter\n:INPUT ACCEPT [0:0]\n" + `-A INPUT -m comment --comment "a \"-j\" -j CRIU" -j ACCEPT` + "\n" + `-A INPUT -m comment --comment "-g X"` + "\nCOMMIT\n", "*filter\n:INPUT\nINPUT>ACCEPT\nINPUT>\n"},
		{"goto", "*filter\n:A - [0:0]\n:B - [0:0]\n-A A -i lo -g B\nCOMMIT\n", "*filter\n:A :B\nA>B\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			save := tc.save
			if name, ok := strings.CutPrefix(save, "@"); ok {
				b, err := os.ReadFile("testdata/" + name)
				if err != nil {
					t.Fatal(err)
				}
				save = string(b)
			}
			if got := summary(Parse(save)); got != tc.want {
				t.Errorf("Parse:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// Every rule's Delete line is the rule with -D for -A, and Line is the
// save's line unchanged.
func TestRuleLineAndDelete(t *testing.T) {
	line := `-A POSTROUTING -s 10.1.0.2/32 -m comment --comment "name: \"n\" id: \"x\"" -j CNI-abc`
	tables := Parse("*nat\n:POSTROUTING ACCEPT [0:0]\n" + line + "\nCOMMIT\n")
	r := tables[0].Rules[0]
	if r.Line != line || r.Chain != "POSTROUTING" || r.Target != "CNI-abc" {
		t.Fatalf("rule %+v", r)
	}
	if want := "-D" + strings.TrimPrefix(line, "-A"); r.Delete() != want {
		t.Fatalf("Delete() = %q, want %q", r.Delete(), want)
	}
	if !tables[0].Declares("POSTROUTING") || tables[0].Declares("CNI-abc") {
		t.Fatalf("Declares: chains %v", tables[0].Chains)
	}
}

// What the captured saves hold (both families' saves have the same
// rules, with their own addresses).
const (
	wantFilter = `*filter
:INPUT :FORWARD :OUTPUT :BERTH-GOTO :CRIU
INPUT>CRIU
INPUT>ACCEPT
FORWARD>BERTH-GOTO
FORWARD>
OUTPUT>CRIU
CRIU>ACCEPT
CRIU>DROP
`
	wantNat = `*nat
:PREROUTING :INPUT :OUTPUT :POSTROUTING :BERTH-MASQ-bt7 :CNI-0a1b2c3d4e5f60718293a4b5 :CNI-DN-0a1b2c3d4e5f60718293a :CNI-HOSTPORT-DNAT :CNI-empty0123456789abcdef
PREROUTING>CNI-HOSTPORT-DNAT
POSTROUTING>CNI-0a1b2c3d4e5f60718293a4b5
POSTROUTING>BERTH-MASQ-bt7
CNI-0a1b2c3d4e5f60718293a4b5>ACCEPT
CNI-0a1b2c3d4e5f60718293a4b5>MASQUERADE
CNI-DN-0a1b2c3d4e5f60718293a>DNAT
CNI-HOSTPORT-DNAT>CNI-DN-0a1b2c3d4e5f60718293a
`
	wantV4    = wantFilter + wantNat
	wantV6    = wantFilter + wantNat
	wantV6Nat = wantNat
)
