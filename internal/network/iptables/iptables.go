// Package iptables is berth's one reading of netfilter rules: the output
// of iptables-save and ip6tables-save parsed by one parser, and changes
// applied in one batch through iptables-restore --noflush, for both
// address families alike. The network package (orphaned CNI rules, the
// default network's masquerade, CRIU's network lock) and the test
// helpers (leak checks, debris of killed test daemons) all read rules
// through it.
package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Family is an address family's iptables program: "iptables" or
// "ip6tables"; its save and restore programs add "-save", "-restore".
type Family string

// The two families. Whatever berth does to IPv4 rules it does to IPv6.
const (
	IPv4 Family = "iptables"
	IPv6 Family = "ip6tables"
)

// Families are both families, IPv4 first.
func Families() []Family { return []Family{IPv4, IPv6} }

// Available reports whether the family's rules can be read here: its
// save program is installed and, for IPv6, the kernel has IPv6 (booted
// with ipv6.disable=1 it has no /proc/sys/net/ipv6 and no rules).
func (f Family) Available() bool {
	if _, err := exec.LookPath(string(f) + "-save"); err != nil {
		return false
	}
	if f == IPv6 {
		if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
			return false
		}
	}
	return true
}

// Table is one table of a save: the chains it declares, in order, and
// its rules, in order.
type Table struct {
	Name   string
	Chains []string
	Rules  []Rule
}

// Declares reports whether the table declares chain.
func (t *Table) Declares(chain string) bool {
	for _, c := range t.Chains {
		if c == chain {
			return true
		}
	}
	return false
}

// Rule is one "-A" line of a save.
type Rule struct {
	// Chain is the chain the rule is in.
	Chain string
	// Line is the rule as the save printed it: "-A CHAIN ...".
	Line string
	// Target is the rule's -j or -g target ("" when it has none).
	Target string
}

// Delete is the iptables-restore line that deletes the rule.
func (r Rule) Delete() string { return "-D " + strings.TrimPrefix(r.Line, "-A ") }

// Parse reads the output of iptables-save or ip6tables-save: "*table"
// opens a table, ":CHAIN POLICY [packets:bytes]" declares a chain, "-A"
// lines are rules, "COMMIT" closes the table; comments ("#") and anything
// else are skipped. A table the text does not close is kept as far as it
// goes.
func Parse(save string) []Table {
	var out []Table
	var cur *Table
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case strings.HasPrefix(line, "*"):
			out = append(out, Table{Name: strings.TrimSpace(line[1:])})
			cur = &out[len(out)-1]
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line[1:]); len(f) > 0 {
				cur.Chains = append(cur.Chains, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			if r, ok := parseRule(line); ok {
				cur.Rules = append(cur.Rules, r)
			}
		case line == "COMMIT":
			cur = nil
		}
	}
	return out
}

// parseRule splits an "-A" line into words as the save quotes them
// (comments are in double quotes, with \" inside), so a comment that
// reads like "-j X" is not taken for the target.
func parseRule(line string) (Rule, bool) {
	words := split(line)
	if len(words) < 2 {
		return Rule{}, false
	}
	r := Rule{Chain: words[1], Line: line}
	for i := 2; i+1 < len(words); i++ {
		if words[i] == "-j" || words[i] == "-g" {
			r.Target = words[i+1]
		}
	}
	return r, true
}

// split cuts a line at spaces outside double quotes; a backslash escapes
// the next character. The words keep their quotes: only -j and -g are
// compared, and those are never quoted.
func split(line string) []string {
	var words []string
	var w strings.Builder
	quoted, escaped := false, false
	for _, c := range line {
		switch {
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == ' ' && !quoted:
			if w.Len() > 0 {
				words = append(words, w.String())
				w.Reset()
			}
			continue
		}
		w.WriteRune(c)
	}
	if w.Len() > 0 {
		words = append(words, w.String())
	}
	return words
}

// Save reads the family's rules: one table, or every table when table is
// "". A family whose save program is not installed fails with an error
// that wraps exec.ErrNotFound.
func Save(ctx context.Context, f Family, table string) ([]Table, error) {
	name, args := string(f)+"-save", []string{}
	if table != "" {
		args = append(args, "-t", table)
		name += " -t " + table
	}
	out, err := exec.CommandContext(ctx, string(f)+"-save", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			return nil, fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return Parse(string(out)), nil
}

// Restore applies an iptables-restore script to the family's rules
// without flushing anything else (--noflush), waiting for the xtables
// lock rather than failing on it. The script holds its own "*table" and
// "COMMIT" lines; a table's changes apply all or none.
func Restore(ctx context.Context, f Family, script string) error {
	prog := string(f) + "-restore"
	cmd := exec.CommandContext(ctx, prog, "--noflush", "--wait")
	cmd.Stdin = strings.NewReader(script)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", prog, err, strings.TrimSpace(string(b)))
	}
	return nil
}
