package network

import (
	"fmt"
	"net"
	"os/exec"
	"strings"
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
func ensureMasquerade(bridge, subnet string) error {
	_, ipn, err := net.ParseCIDR(subnet)
	if err != nil {
		return fmt.Errorf("default network subnet %q: %w", subnet, err)
	}
	save, restore, multicast := "iptables-save", "iptables-restore", "224.0.0.0/4"
	if ipn.IP.To4() == nil {
		save, restore, multicast = "ip6tables-save", "ip6tables-restore", "ff00::/8"
	}
	out, err := exec.Command(save, "-t", "nat").Output()
	if err != nil {
		return fmt.Errorf("%s: %w", save, err)
	}
	chain := masqChain(bridge)
	comment := fmt.Sprintf("%q", "berth default network "+bridge)
	var script strings.Builder
	script.WriteString("*nat\n:" + chain + " - [0:0]\n")
	fmt.Fprintf(&script, "-A %s -d %s -m comment --comment %s -j ACCEPT\n", chain, ipn, comment)
	fmt.Fprintf(&script, "-A %s ! -d %s -m comment --comment %s -j MASQUERADE\n", chain, multicast, comment)
	jumped := false
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "-A POSTROUTING ") || !strings.HasSuffix(line, " -j "+chain) {
			continue
		}
		if strings.Contains(line, " -s "+ipn.String()+" ") && !jumped {
			jumped = true
			continue
		}
		script.WriteString("-D" + strings.TrimPrefix(line, "-A") + "\n")
	}
	if !jumped {
		fmt.Fprintf(&script, "-A POSTROUTING -s %s -m comment --comment %s -j %s\n", ipn, comment, chain)
	}
	script.WriteString("COMMIT\n")
	cmd := exec.Command(restore, "--noflush", "--wait")
	cmd.Stdin = strings.NewReader(script.String())
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", restore, err, b)
	}
	return nil
}
