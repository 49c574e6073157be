package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// dig is the subset of BIND's dig the cluster suite's DNS specs run in
// agnhost and glibc-dns-testing (test/e2e/network/dns_common.go):
//
//	dig +notcp +noall +answer +search NAME A|AAAA|SRV|PTR
//	dig +tcp +noall +answer +search NAME A|AAAA|SRV|PTR
//	dig +short NAME CNAME|A|AAAA
//
// It asks the first nameserver of /etc/resolv.conf (or @SERVER) over UDP
// (TCP with +tcp) and prints the answer section: "NAME TTL IN TYPE DATA"
// lines, or with +short the data alone. +search tries the search domains
// of resolv.conf as dig does: for a relative name with fewer dots than
// ndots, NAME.<domain> in order, then NAME; the first answer that is not
// NXDOMAIN (or an empty NOERROR) is printed. Other + options are accepted
// and ignored. Exit status 0 when the server answered, 9 when it did not
// (dig's "no reply").
func dig(args []string, stdout io.Writer) int {
	var (
		tcp, short, search bool
		server, name       string
		qtype              uint16 = typeA
	)
	for _, a := range args {
		switch {
		case a == "+tcp" || a == "+vc":
			tcp = true
		case a == "+notcp" || a == "+novc":
			tcp = false
		case a == "+short":
			short = true
		case a == "+search":
			search = true
		case a == "+nosearch":
			search = false
		case strings.HasPrefix(a, "+"):
		case strings.HasPrefix(a, "@"):
			server = a[1:]
		case a == "IN":
		default:
			if t, ok := typeByName[strings.ToUpper(a)]; ok && name != "" {
				qtype = t
			} else {
				name = a
			}
		}
	}
	if name == "" {
		fmt.Fprintln(os.Stderr, "dig: no name")
		return 1
	}
	conf := readResolvConf(resolvConfPath)
	if server == "" {
		if len(conf.servers) == 0 {
			fmt.Fprintln(os.Stderr, "dig: no nameserver in /etc/resolv.conf")
			return 9
		}
		server = conf.servers[0]
	}
	names := []string{name}
	if search {
		names = searchNames(name, conf)
	}
	var last *dnsReply
	for _, n := range names {
		r, err := query(server, n, qtype, tcp)
		if err != nil {
			fmt.Fprintf(os.Stderr, ";; communications error to %s: %v\n", server, err)
			return 9
		}
		last = r
		if r.rcode == 0 && len(r.answers) > 0 {
			break
		}
	}
	for _, rr := range last.answers {
		if short {
			fmt.Fprintln(stdout, rr.data)
		} else {
			fmt.Fprintf(stdout, "%s\t%d\tIN\t%s\t%s\n", rr.name, rr.ttl, typeName(rr.rtype), rr.data)
		}
	}
	return 0
}

// getent is `getent hosts NAME` (the DNS specs' /etc/hosts check) as
// musl's or glibc's would answer with "hosts: files dns": /etc/hosts first,
// then DNS with the search list (Go's resolver does both). Prints
// "ADDRESS NAME" per address; exit 2 when the name is not found.
func getent(args []string, stdout io.Writer) int {
	if len(args) != 2 || args[0] != "hosts" {
		fmt.Fprintln(os.Stderr, "usage: getent hosts NAME (the only database this stand-in has)")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, args[1])
	if err != nil || len(addrs) == 0 {
		return 2
	}
	for _, a := range addrs {
		fmt.Fprintf(stdout, "%-15s %s\n", a, args[1])
	}
	return 0
}

const (
	typeA     uint16 = 1
	typeNS    uint16 = 2
	typeCNAME uint16 = 5
	typeSOA   uint16 = 6
	typePTR   uint16 = 12
	typeTXT   uint16 = 16
	typeAAAA  uint16 = 28
	typeSRV   uint16 = 33
	typeANY   uint16 = 255
)

// resolvConfPath is where dig finds its nameserver and search list.
var resolvConfPath = "/etc/resolv.conf"

var typeByName = map[string]uint16{"A": typeA, "NS": typeNS, "CNAME": typeCNAME, "SOA": typeSOA, "PTR": typePTR,
	"TXT": typeTXT, "AAAA": typeAAAA, "SRV": typeSRV, "ANY": typeANY}

func typeName(t uint16) string {
	for n, v := range typeByName {
		if v == t {
			return n
		}
	}
	return "TYPE" + strconv.Itoa(int(t))
}

type resolvConf struct {
	servers, search []string
	ndots           int
}

func readResolvConf(path string) resolvConf {
	c := resolvConf{ndots: 1}
	f, err := os.Open(path)
	if err != nil {
		return c
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		switch fs[0] {
		case "nameserver":
			c.servers = append(c.servers, fs[1])
		case "search", "domain":
			c.search = fs[1:]
		case "options":
			for _, o := range fs[1:] {
				if v, ok := strings.CutPrefix(o, "ndots:"); ok {
					if n, err := strconv.Atoi(v); err == nil {
						c.ndots = n
					}
				}
			}
		}
	}
	return c
}

// searchNames is the order dig +search tries: an absolute name alone; a
// name with at least ndots dots as it is first, then with each domain; a
// shorter one with each domain first, then as it is.
func searchNames(name string, c resolvConf) []string {
	if strings.HasSuffix(name, ".") {
		return []string{name}
	}
	var withDomains []string
	for _, d := range c.search {
		withDomains = append(withDomains, name+"."+strings.TrimSuffix(d, "."))
	}
	if strings.Count(name, ".") >= c.ndots {
		return append([]string{name}, withDomains...)
	}
	return append(withDomains, name)
}

type dnsRR struct {
	name  string
	rtype uint16
	ttl   uint32
	data  string
}

type dnsReply struct {
	rcode   int
	answers []dnsRR
}

// query sends one question to server (port 53 unless given) and parses
// the answer section.
func query(server, name string, qtype uint16, tcp bool) (*dnsReply, error) {
	if _, _, err := net.SplitHostPort(server); err != nil {
		server = net.JoinHostPort(server, "53")
	}
	msg, id, err := buildQuery(name, qtype)
	if err != nil {
		return nil, err
	}
	var resp []byte
	if tcp {
		conn, err := net.DialTimeout("tcp", server, 5*time.Second)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)); err != nil {
			return nil, err
		}
		var l [2]byte
		if _, err := io.ReadFull(conn, l[:]); err != nil {
			return nil, err
		}
		resp = make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(conn, resp); err != nil {
			return nil, err
		}
	} else {
		conn, err := net.Dial("udp", server)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		buf := make([]byte, 65535)
		for try := 0; try < 3 && resp == nil; try++ {
			if _, err := conn.Write(msg); err != nil {
				return nil, err
			}
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			for {
				n, err := conn.Read(buf)
				if err != nil {
					if errors.Is(err, os.ErrDeadlineExceeded) {
						break
					}
					return nil, err
				}
				if n >= 2 && binary.BigEndian.Uint16(buf) == id {
					resp = buf[:n]
					break
				}
			}
		}
		if resp == nil {
			return nil, errors.New("timed out")
		}
	}
	return parseReply(resp, id)
}

func buildQuery(name string, qtype uint16) ([]byte, uint16, error) {
	id := uint16(rand.IntN(65536))
	// Header: id, flags RD, one question.
	msg := binary.BigEndian.AppendUint16(nil, id)
	msg = append(msg, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0)
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if label == "" || len(label) > 63 {
			return nil, 0, fmt.Errorf("bad name %q", name)
		}
		msg = append(msg, byte(len(label)))
		msg = append(msg, label...)
	}
	msg = append(msg, 0)
	msg = binary.BigEndian.AppendUint16(msg, qtype)
	msg = binary.BigEndian.AppendUint16(msg, 1) // IN
	return msg, id, nil
}

var errShort = errors.New("short DNS message")

func parseReply(b []byte, id uint16) (*dnsReply, error) {
	if len(b) < 12 {
		return nil, errShort
	}
	if binary.BigEndian.Uint16(b) != id {
		return nil, errors.New("reply to another query")
	}
	r := &dnsReply{rcode: int(b[3] & 0x0f)}
	qd, an := int(binary.BigEndian.Uint16(b[4:])), int(binary.BigEndian.Uint16(b[6:]))
	off := 12
	for range qd {
		_, n, err := readName(b, off)
		if err != nil {
			return nil, err
		}
		off = n + 4
	}
	for range an {
		name, n, err := readName(b, off)
		if err != nil {
			return nil, err
		}
		if n+10 > len(b) {
			return nil, errShort
		}
		rr := dnsRR{name: name, rtype: binary.BigEndian.Uint16(b[n:]), ttl: binary.BigEndian.Uint32(b[n+4:])}
		rdlen := int(binary.BigEndian.Uint16(b[n+8:]))
		start := n + 10
		if start+rdlen > len(b) {
			return nil, errShort
		}
		rd := b[start : start+rdlen]
		switch rr.rtype {
		case typeA, typeAAAA:
			rr.data = net.IP(rd).String()
		case typeCNAME, typePTR, typeNS:
			rr.data, _, err = readName(b, start)
		case typeSRV:
			if rdlen < 7 {
				return nil, errShort
			}
			var target string
			target, _, err = readName(b, start+6)
			rr.data = fmt.Sprintf("%d %d %d %s", binary.BigEndian.Uint16(rd), binary.BigEndian.Uint16(rd[2:]), binary.BigEndian.Uint16(rd[4:]), target)
		default:
			rr.data = fmt.Sprintf("\\# %d %x", rdlen, rd)
		}
		if err != nil {
			return nil, err
		}
		r.answers = append(r.answers, rr)
		off = start + rdlen
	}
	return r, nil
}

// readName reads the (possibly compressed) name at off: the name with a
// trailing dot, and the offset just past it.
func readName(b []byte, off int) (string, int, error) {
	var labels []string
	end := -1
	for hops := 0; ; hops++ {
		if off >= len(b) || hops > 128 {
			return "", 0, errShort
		}
		l := int(b[off])
		switch {
		case l == 0:
			if end < 0 {
				end = off + 1
			}
			return strings.Join(labels, ".") + ".", end, nil
		case l&0xc0 == 0xc0:
			if off+1 >= len(b) {
				return "", 0, errShort
			}
			if end < 0 {
				end = off + 2
			}
			off = int(binary.BigEndian.Uint16(b[off:]) & 0x3fff)
		default:
			if off+1+l > len(b) {
				return "", 0, errShort
			}
			labels = append(labels, string(b[off+1:off+1+l]))
			off += 1 + l
		}
	}
}
