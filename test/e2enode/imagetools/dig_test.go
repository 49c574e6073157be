package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeDNS answers over UDP and TCP on one port from a table of
// "name type" -> answers, names in the answers compressed against the
// question (as CoreDNS does); an unknown name is NXDOMAIN.
type fakeDNS struct {
	addr string
	// zone maps "name. TYPE" to a builder of the answer records.
	zone map[string]func(msg []byte) []byte
}

func startFakeDNS(t *testing.T, zone map[string]func([]byte) []byte) *fakeDNS {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		t.Skipf("TCP port of the UDP one taken: %v", err)
	}
	t.Cleanup(func() { pc.Close(); ln.Close() })
	f := &fakeDNS{addr: pc.LocalAddr().String(), zone: zone}
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(f.answer(buf[:n]), from)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var l [2]byte
			if _, err := io.ReadFull(c, l[:]); err == nil {
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err == nil {
					a := f.answer(q)
					_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
				}
			}
			c.Close()
		}
	}()
	return f
}

func (f *fakeDNS) answer(q []byte) []byte {
	name, end, err := readName(q, 12)
	if err != nil {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[end:])
	msg := append([]byte(nil), q[:end+4]...)
	msg[2] |= 0x80 // QR
	build, ok := f.zone[name+" "+typeName(qtype)]
	if !ok {
		msg[3] |= 3 // NXDOMAIN
		return msg
	}
	rrs := build(msg)
	binary.BigEndian.PutUint16(msg[6:], uint16(bytes.Count(rrs, []byte{0xc0, 0x0c})))
	return append(msg, rrs...)
}

// rr is one answer record named by a pointer to the question (0xc00c).
func rr(rtype uint16, rdata []byte) []byte {
	b := []byte{0xc0, 0x0c}
	b = binary.BigEndian.AppendUint16(b, rtype)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint32(b, 30)
	b = binary.BigEndian.AppendUint16(b, uint16(len(rdata)))
	return append(b, rdata...)
}

func wireName(name string) []byte {
	var b []byte
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}

func TestDig(t *testing.T) {
	dns := startFakeDNS(t, map[string]func([]byte) []byte{
		"svc.ns.svc.cluster.local. A": func([]byte) []byte { return rr(typeA, []byte{10, 96, 0, 5}) },
		"ext.ns.svc.cluster.local. CNAME": func([]byte) []byte {
			return rr(typeCNAME, wireName("foo.example.com."))
		},
		"_http._tcp.svc.ns.svc.cluster.local. SRV": func([]byte) []byte {
			return rr(typeSRV, append([]byte{0, 0, 0, 100, 0, 80}, wireName("svc.ns.svc.cluster.local.")...))
		},
		"5.0.96.10.in-addr.arpa. PTR": func([]byte) []byte { return rr(typePTR, wireName("svc.ns.svc.cluster.local.")) },
	})
	host, port, _ := net.SplitHostPort(dns.addr)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search ns.svc.cluster.local svc.cluster.local cluster.local\nnameserver "+host+"\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resolvConfPath = resolv
	defer func() { resolvConfPath = "/etc/resolv.conf" }()
	conf := readResolvConf(resolv)
	if got := searchNames("svc.ns", conf); got[0] != "svc.ns.ns.svc.cluster.local" || got[len(got)-1] != "svc.ns" {
		t.Errorf("search order %v", got)
	}
	server := "@" + net.JoinHostPort(host, port)
	for _, tc := range []struct {
		args []string
		want string
	}{
		// The musl and glibc queriers' probes (createProbeCommand).
		{[]string{"+notcp", "+noall", "+answer", "+search", "svc.ns.svc.cluster.local", "A"}, "svc.ns.svc.cluster.local.\t30\tIN\tA\t10.96.0.5\n"},
		{[]string{"+tcp", "+noall", "+answer", "+search", "svc.ns.svc.cluster.local", "A"}, "svc.ns.svc.cluster.local.\t30\tIN\tA\t10.96.0.5\n"},
		{[]string{"+notcp", "+noall", "+answer", "+search", "_http._tcp.svc.ns.svc.cluster.local", "SRV"}, "_http._tcp.svc.ns.svc.cluster.local.\t30\tIN\tSRV\t0 100 80 svc.ns.svc.cluster.local.\n"},
		{[]string{"+tcp", "+noall", "+answer", "+search", "5.0.96.10.in-addr.arpa.", "PTR"}, "5.0.96.10.in-addr.arpa.\t30\tIN\tPTR\tsvc.ns.svc.cluster.local.\n"},
		// createTargetedProbeCommand: the ExternalName spec.
		{[]string{"+short", "ext.ns.svc.cluster.local", "CNAME"}, "foo.example.com.\n"},
		{[]string{"+short", "nothere.ns.svc.cluster.local", "A"}, ""},
	} {
		var out bytes.Buffer
		if rc := dig(append([]string{server}, tc.args...), &out); rc != 0 {
			t.Errorf("dig %v: exit %d", tc.args, rc)
		}
		if out.String() != tc.want {
			t.Errorf("dig %v: %q, want %q", tc.args, out.String(), tc.want)
		}
	}
}

// TestDigSearch: a short name is tried with the search domains first, as
// the DNS specs' partial names ("svc.ns") need.
func TestDigSearch(t *testing.T) {
	dns := startFakeDNS(t, map[string]func([]byte) []byte{
		"svc.ns.svc.cluster.local. A": func([]byte) []byte { return rr(typeA, []byte{10, 96, 0, 5}) },
	})
	host, port, _ := net.SplitHostPort(dns.addr)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search ns.svc.cluster.local svc.cluster.local cluster.local\nnameserver "+host+"\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resolvConfPath = resolv
	defer func() { resolvConfPath = "/etc/resolv.conf" }()
	var out bytes.Buffer
	if rc := dig([]string{"@" + net.JoinHostPort(host, port), "+notcp", "+noall", "+answer", "+search", "svc.ns", "A"}, &out); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	if want := "svc.ns.svc.cluster.local.\t30\tIN\tA\t10.96.0.5\n"; out.String() != want {
		t.Errorf("%q, want %q", out.String(), want)
	}
}
