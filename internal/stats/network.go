package stats

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/netns"
)

// Interface holds one network interface's counters.
type Interface struct {
	Name                string
	RxBytes, RxPackets  uint64
	RxErrors, RxDropped uint64
	TxBytes, TxPackets  uint64
	TxErrors, TxDropped uint64
}

// Network reads the interfaces of the network namespace pinned at path
// ("" for the host's), loopback excluded.
func Network(path string) ([]Interface, error) {
	var data []byte
	read := func() error {
		var err error
		// thread-self: /proc/self/net would show the thread group
		// leader's namespace, not this locked thread's.
		data, err = os.ReadFile("/proc/thread-self/net/dev")
		return err
	}
	var err error
	if path == "" {
		err = read()
	} else {
		err = netns.Do(path, read)
	}
	if err != nil {
		return nil, fmt.Errorf("read network counters: %w", err)
	}
	return parseNetDev(data)
}

// parseNetDev parses /proc/net/dev: two header lines, then
// "name: rx_bytes packets errs drop fifo frame compressed multicast tx_bytes packets errs ...".
func parseNetDev(data []byte) ([]Interface, error) {
	var out []Interface
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 0; sc.Scan(); line++ {
		if line < 2 {
			continue
		}
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if len(f) < 12 {
			return nil, fmt.Errorf("parse /proc/net/dev line %q", sc.Text())
		}
		if name == "lo" {
			continue
		}
		n := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
		out = append(out, Interface{
			Name:    name,
			RxBytes: n(0), RxPackets: n(1), RxErrors: n(2), RxDropped: n(3),
			TxBytes: n(8), TxPackets: n(9), TxErrors: n(10), TxDropped: n(11),
		})
	}
	return out, sc.Err()
}
