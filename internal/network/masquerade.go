package network

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/berthcri/berth/internal/network/iptables"
)

// The embedded default network masquerades its pods' outgoing traffic
// with one node-level rule for its whole subnet instead of the bridge
// plugin's ipMasq, which makes a chain and three rules per pod on ADD
// and removes them on DEL: about eight iptables processes per pod each
// way, half the cost of a pod's CNI ADD here (decision 1601). The rules
// match what ipMasq makes, per subnet rather than per pod address:
//
//	-A POSTROUTING -s <subnet> -j BERTH-MASQ-<bridge>
//	-A BERTH-MASQ-<bridge> -d <subnet> -j ACCEPT
//	-A BERTH-MASQ-<bridge> ! -d 224.0.0.0/4 -j MASQUERADE
//
// Like the bridge itself they stay when berthd stops.

// masqChain is the chain of a bridge's masquerade rules (iptables chain
// names take 28 bytes; a bridge name at most 15).
func masqChain(bridge string) string { return "BERTH-MASQ-" + bridge }

// ensureMasquerade installs the node-level masquerade of the embedded
// network, idempotently: the chain is rewritten whole and the POSTROUTING
// jump added unless there, in one iptables-restore; a jump left for
// another subnet (the key changed) is removed.
func ensureMasquerade(ctx context.Context, bridge, subnet string) error {
	_, ipn, err := net.ParseCIDR(subnet)
	if err != nil {
		return fmt.Errorf("default network subnet %q: %w", subnet, err)
	}
	family, multicast := iptables.IPv4, "224.0.0.0/4"
	if ipn.IP.To4() == nil {
		family, multicast = iptables.IPv6, "ff00::/8"
	}
	tables, err := iptables.Save(ctx, family, "nat")
	if err != nil {
		return err
	}
	chain := masqChain(bridge)
	comment := fmt.Sprintf("%q", "berth default network "+bridge)
	var script strings.Builder
	script.WriteString("*nat\n:" + chain + " - [0:0]\n")
	fmt.Fprintf(&script, "-A %s -d %s -m comment --comment %s -j ACCEPT\n", chain, ipn, comment)
	fmt.Fprintf(&script, "-A %s ! -d %s -m comment --comment %s -j MASQUERADE\n", chain, multicast, comment)
	jumped := false
	for _, t := range tables {
		for _, r := range t.Rules {
			if r.Chain != "POSTROUTING" || r.Target != chain {
				continue
			}
			if strings.Contains(r.Line, " -s "+ipn.String()+" ") && !jumped {
				jumped = true
				continue
			}
			script.WriteString(r.Delete() + "\n")
		}
	}
	if !jumped {
		fmt.Fprintf(&script, "-A POSTROUTING -s %s -m comment --comment %s -j %s\n", ipn, comment, chain)
	}
	script.WriteString("COMMIT\n")
	return iptables.Restore(ctx, family, script.String())
}
