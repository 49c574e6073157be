package network

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// removeOrphanRules deletes the NAT rules CNI plugins tagged with this
// pod's attachment comment (`name: "<net>" id: "<pod>"`) and the per-pod
// chains they jump to. Only needed when the pod's netns vanished before
// DEL: the bridge plugin then cannot learn the pod's addresses and skips
// its masquerade teardown.
func removeOrphanRules(netName, podID string) error {
	tag := fmt.Sprintf(`name: \"%s\" id: \"%s\"`, netName, podID)
	return RemoveNATRules(func(line string) bool { return strings.Contains(line, tag) })
}

// RemoveNATRules deletes every nat-table rule for which match is true and
// the per-attachment CNI-* chains and default-network BERTH-MASQ-* chains
// those rules jump to (never portmap's shared CNI-HOSTPORT-* chains).
func RemoveNATRules(match func(rule string) bool) error {
	if _, err := exec.LookPath("iptables-save"); err != nil {
		return nil
	}
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		return fmt.Errorf("iptables-save: %w", err)
	}
	var script bytes.Buffer
	seen := map[string]bool{}
	var chains []string
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "-A ") || !match(line) {
			continue
		}
		n++
		script.WriteString("-D " + strings.TrimPrefix(line, "-A ") + "\n")
		if i := strings.LastIndex(line, " -j "); i >= 0 {
			target := strings.Fields(line[i+4:])
			if len(target) > 0 && ownChain(target[0]) && !seen[target[0]] {
				seen[target[0]] = true
				chains = append(chains, target[0])
			}
		}
	}
	if n == 0 {
		return nil
	}
	for _, c := range chains {
		script.WriteString("-F " + c + "\n-X " + c + "\n")
	}
	cmd := exec.Command("iptables-restore", "--noflush", "--wait")
	cmd.Stdin = strings.NewReader("*nat\n" + script.String() + "COMMIT\n")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %v: %s", err, b)
	}
	return nil
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
