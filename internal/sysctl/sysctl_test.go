package sysctl

import "testing"

func TestKeyAndPath(t *testing.T) {
	for _, tc := range []struct {
		name, key, path string
		ns              Namespace
	}{
		{"net.ipv4.ip_forward", "net.ipv4.ip_forward", "net/ipv4/ip_forward", Network},
		{"net/ipv4/ip_forward", "net.ipv4.ip_forward", "net/ipv4/ip_forward", Network},
		// A VLAN interface's dot: the slash form keeps it, the dotted
		// form spells it as a slash (issue 34, finding 11).
		{"net/ipv4/conf/eth0.100/forwarding", "net.ipv4.conf.eth0/100.forwarding", "net/ipv4/conf/eth0.100/forwarding", Network},
		{"net.ipv4.conf.eth0/100.forwarding", "net.ipv4.conf.eth0/100.forwarding", "net/ipv4/conf/eth0.100/forwarding", Network},
		{"kernel/shm_rmid_forced", "kernel.shm_rmid_forced", "kernel/shm_rmid_forced", IPC},
		{"fs.mqueue.msg_max", "fs.mqueue.msg_max", "fs/mqueue/msg_max", IPC},
		{"kernel.domainname", "kernel.domainname", "kernel/domainname", UTS},
		{"kernel.core_pattern", "kernel.core_pattern", "kernel/core_pattern", NotNamespaced},
		{"vm.swappiness", "vm.swappiness", "vm/swappiness", NotNamespaced},
	} {
		key, err := Key(tc.name)
		if err != nil || key != tc.key || Path(key) != tc.path || NamespaceOf(key) != tc.ns {
			t.Errorf("Key(%q) = %q, %v (path %q, ns %q); want %q (path %q, ns %q)",
				tc.name, key, err, Path(key), NamespaceOf(key), tc.key, tc.path, tc.ns)
		}
	}
}

// TestKeyRefusesInjection: names that would leave the sysctl they claim
// to be (CVE-2022-0811's '+'/'=' smuggling, ".." climbing out of net/).
func TestKeyRefusesInjection(t *testing.T) {
	for _, name := range []string{
		"", "net.", ".net.ipv4.ip_forward", "net..ipv4", "net/ipv4/../../kernel/core_pattern",
		"net.ipv4/../../kernel.core_pattern", "net.ipv4.ip_forward=1+kernel.core_pattern=|/x",
		"net.ipv4.ip_forward+kernel.core_pattern", "net.ipv4. ip_forward", "net.ipv4.ip_forward\x00",
		"net.ipv4.conf.eth0/./forwarding", "net.ipv4//ip_forward", "NET.ipv4.ip_forward",
	} {
		if key, err := Key(name); err == nil {
			t.Errorf("Key(%q) = %q, want an error", name, key)
		}
	}
}

func TestCheckValue(t *testing.T) {
	for v, ok := range map[string]bool{
		"1": true, "1024 65000": true, "0 2147483647": true, "": true,
		"1+kernel.core_pattern=|/tmp/x": false, "1\nx": false, "a=b": false, "1\x00": false,
	} {
		if err := CheckValue("k", v); (err == nil) != ok {
			t.Errorf("CheckValue(%q) = %v, want ok %v", v, err, ok)
		}
	}
}
