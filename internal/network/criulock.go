package network

import (
	"context"
	"errors"
	"strings"

	"github.com/berthcri/berth/internal/netns"
	"github.com/berthcri/berth/internal/network/iptables"
)

// criuChain is the filter chain CRIU's iptables network lock adds to a
// namespace it dumps, with jumps to it from INPUT and OUTPUT: it drops
// every packet CRIU itself does not mark.
const criuChain = "CRIU"

// RemoveCRIULock removes the network lock CRIU puts on the network
// namespace pinned at netnsPath while it dumps, and removes again at the
// end: a CRIU killed at the deadline leaves it, and the pod would answer
// no packet. IPv4 and IPv6 alike; one save per family, and a restore only
// where the lock is there.
func RemoveCRIULock(ctx context.Context, netnsPath string) error {
	return netns.Do(netnsPath, func() error {
		var errs []error
		for _, f := range iptables.Families() {
			if !f.Available() {
				continue
			}
			tables, err := iptables.Save(ctx, f, "filter")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if script := criuUnlockScript(tables); script != "" {
				if err := iptables.Restore(ctx, f, script); err != nil {
					errs = append(errs, err)
				}
			}
		}
		return errors.Join(errs...)
	})
}

// criuUnlockScript deletes the jumps to CRIU's chain and the chain; ""
// when the filter table has no such chain.
func criuUnlockScript(tables []iptables.Table) string {
	for _, t := range tables {
		if t.Name != "filter" || !t.Declares(criuChain) {
			continue
		}
		var script strings.Builder
		script.WriteString("*filter\n")
		for _, r := range t.Rules {
			if r.Target == criuChain {
				script.WriteString(r.Delete() + "\n")
			}
		}
		script.WriteString("-F " + criuChain + "\n-X " + criuChain + "\nCOMMIT\n")
		return script.String()
	}
	return ""
}
