package berthdtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
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

// release deletes the slot's bridge (CNI never deletes bridges) and frees
// the slot.
func (s *netSlot) release() {
	if s == nil {
		return
	}
	_ = exec.Command("ip", "link", "del", s.Bridge).Run()
	s.lock.Close()
}
