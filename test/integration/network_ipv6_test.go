package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/network/iptables"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// A dual-stack pod (an IPv4 and an IPv6 range, the bridge plugin
// masquerading both) whose network namespace pin vanished while berthd
// was down is removed without leaving a NAT rule of either family. The
// bridge plugin cannot learn a gone namespace's addresses and skips its
// masquerade teardown, so berthd's DEL removes what is tagged with the
// pod (network.RemoveNATRules); before issue 37 it read iptables-save
// only, and the pod's IPv6 rule and chain stayed on the node.
func TestSandboxLostNetnsLeavesNoIPv6NATRules(t *testing.T) {
	t.Parallel()
	if !iptables.IPv6.Available() {
		t.Skip("no ip6tables or no IPv6 on this node")
	}
	d := berthdtest.Start(t, berthdtest.Options{})
	scope := leakcheck.ForDaemon(d)
	bridge := d.Config.DefaultNetwork.Bridge
	// One IPv6 subnet per test network slot, as the IPv4 one. No gateway:
	// the bridge plugin would turn on the node's IPv6 forwarding, and the
	// masquerade rules do not need it.
	v6 := fmt.Sprintf("fd00:b34:%s::/64", strings.TrimPrefix(bridge, "bt"))
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"dual","plugins":[{"type":"bridge","bridge":%q,"ipMasq":true,
"ipam":{"type":"host-local","ranges":[[{"subnet":%q}],[{"subnet":%q}]],"dataDir":%q}}]}`,
		bridge, d.Config.DefaultNetwork.Subnet, v6, scope.IPAMDir)
	if err := os.MkdirAll(d.Config.CNIConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Config.CNIConfDir, "10-dual.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	id := runPod(t, d, podConfig("dual"))
	st, info := podStatus(t, d, id)
	ips := []string{st.GetNetwork().GetIp()}
	for _, ip := range st.GetNetwork().GetAdditionalIps() {
		ips = append(ips, ip.GetIp())
	}
	if len(ips) != 2 || net.ParseIP(ips[1]) == nil || net.ParseIP(ips[1]).To4() != nil {
		t.Fatalf("pod addresses %v, want one IPv4 and one IPv6", ips)
	}
	// The rules the bridge plugin tags with the attachment; the slot's
	// cleanup finds a pod's IPv6 rules through its IPv4 ones, so a run
	// that fails here removes them itself.
	tag := fmt.Sprintf(`name: \"dual\" id: \"%s\"`, id)
	t.Cleanup(func() {
		_ = network.RemoveNATRules(context.Background(), func(rule string) bool { return strings.Contains(rule, tag) })
	})
	tagged := func(f iptables.Family) []string {
		t.Helper()
		tables, err := iptables.Save(berthdtest.Ctx(t), f, "nat")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tb := range tables {
			for _, r := range tb.Rules {
				if strings.Contains(r.Line, tag) {
					out = append(out, r.Line)
				}
			}
		}
		return out
	}
	for _, f := range iptables.Families() {
		if len(tagged(f)) == 0 {
			t.Fatalf("no %s masquerade rule for pod %s: the test would prove nothing", f, id)
		}
	}

	d.Kill()
	if err := unix.Unmount(info.NetNSPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(info.NetNSPath); err != nil {
		t.Fatal(err)
	}
	d.Start()
	d.WaitReady()
	stopRemove(t, d, id)
	for _, f := range iptables.Families() {
		if left := tagged(f); len(left) > 0 {
			t.Errorf("%s nat rules of the removed pod survive:\n%s", f, strings.Join(left, "\n"))
		}
	}
}
