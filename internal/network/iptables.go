package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/berthcri/berth/internal/network/iptables"
)

// removeOrphanRules deletes the NAT rules CNI plugins tagged with this
// pod's attachment comment (`name: "<net>" id: "<pod>"`) and the per-pod
// chains they jump to, IPv4 and IPv6 alike. Only needed when the pod's
// netns vanished before DEL: the bridge plugin then cannot learn the
// pod's addresses and skips its masquerade teardown.
func removeOrphanRules(ctx context.Context, netName, podID string) error {
	tag := fmt.Sprintf(`name: \"%s\" id: \"%s\"`, netName, podID)
	return RemoveNATRules(ctx, func(line string) bool { return strings.Contains(line, tag) })
}

// RemoveNATRules deletes, in the IPv4 and the IPv6 nat table, every rule
// for which match is true and the per-attachment CNI-* chains and
// default-network BERTH-MASQ-* chains those rules jump to (never
// portmap's shared CNI-HOSTPORT-* chains): one save and at most one
// restore per family. A family this node cannot read (no ip6tables, no
// IPv6 in the kernel) holds no rules and is skipped.
func RemoveNATRules(ctx context.Context, match func(rule string) bool) error {
	var errs []error
	for _, f := range iptables.Families() {
		if !f.Available() {
			continue
		}
		tables, err := iptables.Save(ctx, f, "nat")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if script := natDeleteScript(tables, match); script != "" {
			if err := iptables.Restore(ctx, f, script); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// natDeleteScript is the restore script that deletes the matching rules
// of the nat table and then the chains of ours they jumped to; "" when
// no rule matches.
func natDeleteScript(tables []iptables.Table, match func(rule string) bool) string {
	var script strings.Builder
	seen := map[string]bool{}
	var chains []string
	for _, t := range tables {
		if t.Name != "nat" {
			continue
		}
		for _, r := range t.Rules {
			if !match(r.Line) {
				continue
			}
			script.WriteString(r.Delete() + "\n")
			if ownChain(r.Target) && !seen[r.Target] {
				seen[r.Target] = true
				chains = append(chains, r.Target)
			}
		}
	}
	if script.Len() == 0 {
		return ""
	}
	for _, c := range chains {
		script.WriteString("-F " + c + "\n-X " + c + "\n")
	}
	return "*nat\n" + script.String() + "COMMIT\n"
}

// ownChain reports whether a chain is one of a CNI attachment's own or the
// default network's masquerade chain: removed with the last rule jumping
// to it.
func ownChain(name string) bool {
	return strings.HasPrefix(name, "CNI-") && !strings.HasPrefix(name, "CNI-HOSTPORT-") || strings.HasPrefix(name, "BERTH-MASQ-")
}

func netnsGone(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return os.IsNotExist(err)
}
