package berthdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/network/iptables"
)

// netLockDir holds one flock per embedded-network slot in use by a test
// daemon on this node; the kernel drops a slot's lock when its holder dies.
const netLockDir = "/run/berthtest-net"

// netSlot is a bridge name and subnet no other live test daemon uses.
type netSlot struct {
	Bridge, Subnet string
	lock           *os.File
}

// allocNetSlot claims a free slot: bridge "bt<n>", subnet 10.234.<n>.0/24.
func allocNetSlot() (*netSlot, error) {
	if err := os.MkdirAll(netLockDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", netLockDir, err)
	}
	for n := 1; n < 255; n++ {
		f, err := os.OpenFile(filepath.Join(netLockDir, fmt.Sprintf("%d.lock", n)), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return &netSlot{Bridge: fmt.Sprintf("bt%d", n), Subnet: fmt.Sprintf("10.234.%d.0/24", n), lock: f}, nil
	}
	return nil, fmt.Errorf("no free test network slot in %s", netLockDir)
}

// release deletes the slot's bridge (CNI never deletes bridges) and any
// NAT rules a failed test left for its pods, then frees the slot.
func (s *netSlot) release() error {
	if s == nil {
		return nil
	}
	defer s.lock.Close()
	_ = exec.Command("ip", "link", "del", s.Bridge).Run()
	return removeNATDebris(strings.TrimSuffix(s.Subnet, "0/24"))
}

var attachmentID = regexp.MustCompile(`id: \\"([0-9a-f]+)\\"`)

// removeNATDebris removes nat rules about the subnet (masquerade, DNAT
// targets) and, through the pod IDs in their comments, the portmap rules
// that name only the pod, in both families (a test may add an IPv6 range
// to its pods).
func removeNATDebris(ipPrefix string) error {
	ctx := context.Background()
	ids := map[string]bool{}
	for _, f := range iptables.Families() {
		if !f.Available() {
			continue
		}
		tables, err := iptables.Save(ctx, f, "nat")
		if err != nil {
			continue // nothing readable: nothing to clean
		}
		for _, tb := range tables {
			for _, r := range tb.Rules {
				if strings.Contains(r.Line, ipPrefix) {
					for _, m := range attachmentID.FindAllStringSubmatch(r.Line, -1) {
						ids[m[1]] = true
					}
				}
			}
		}
	}
	return network.RemoveNATRules(ctx, func(rule string) bool {
		if strings.Contains(rule, ipPrefix) {
			return true
		}
		for _, m := range attachmentID.FindAllStringSubmatch(rule, -1) {
			if ids[m[1]] {
				return true
			}
		}
		return false
	})
}
