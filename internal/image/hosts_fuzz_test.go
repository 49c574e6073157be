package image

import (
	"strings"
	"testing"
)

// FuzzParseHostsFile feeds hostile hosts.toml files to the parser (a
// configuration file is input too). Invariants: no panic; a file
// accepted gives endpoints that each have a host and http or https, the
// last one the upstream; only an http:// scheme (never a private address
// or a name) allows plain HTTP for a configured host; credentials reach a
// mirror only when it names the registry in credential_domain.
// `make fuzz` runs it for FUZZTIME; the size cap is checked before this
// parser (TestHostsFileSizeCap).
func FuzzParseHostsFile(f *testing.F) {
	for _, seed := range []string{
		``,
		`server = "https://registry-1.docker.io"`,
		"server = \"https://docker.io\"\n\n[host.\"https://z-mirror.example.com/v2/hub\"]\n  capabilities = [\"pull\"]\n  override_path = true\n  skip_verify = true\n  dial_timeout = \"2s\"\n\n[host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n  [host.\"http://127.0.0.1:5000\".header]\n    x-test = [\"a\", \"b\"]\n",
		"[host.\"https://m.example.com\"]\n  credential_domain = \"registry.example.com\"\n  ca = [\"a.crt\", \"/etc/b.crt\"]\n  client = [[\"c.pem\", \"k.pem\"]]\n",
		"server = \"http://10.0.0.1:5000\"\nca = \"ca.crt\"\nclient = \"both.pem\"\n[header]\n  x = \"y\"\n",
		`[host."ftp://x"]`,
		"[host.\"https://m\"]\n  credential_domain = \"https://u:p@x\"\n",
		"server = \"https://x\"\ndial_timeout = \"-1h\"\n",
		"a = [[[[[[[[[[1]]]]]]]]]]\n",
		"[host.\"https://a\"]\n[host.\"https://a\".header]\nk = [1, 2, \"x\"]\n",
	} {
		f.Add(seed, "registry.example.com")
	}
	f.Add(`server = "https://127.0.0.1:6000"`, "127.0.0.1:6000")
	f.Fuzz(func(t *testing.T, data, domain string) {
		if len(data) > maxHostsFileSize {
			return // refused before parsing (readHostsFile)
		}
		if _, err := ParseReference(domain + "/x"); err != nil || strings.Contains(domain, "/") {
			domain = "registry.example.com"
		}
		eps, err := parseHostsFile([]byte(data), "/etc/berth/certs.d/"+domain+"/hosts.toml", domain)
		if err != nil {
			return
		}
		if len(eps) == 0 || !eps[len(eps)-1].upstream {
			t.Fatalf("endpoints %v: the last is not the upstream", eps)
		}
		creds := &Auth{Username: "alice", Password: "s3cret"}
		for i, ep := range eps {
			if ep.host == "" || (ep.scheme != "http" && ep.scheme != "https") {
				t.Fatalf("endpoint %d %+v: no host or a scheme that is neither http nor https", i, ep)
			}
			if ep.plainHTTP() != (ep.scheme == "http") {
				t.Fatalf("endpoint %d %s: plain HTTP %v without http:// in the file", i, ep, ep.plainHTTP())
			}
			_ = ep.String()
			got := creds.forEndpoint(ep, domain) != nil
			want := ep.upstream || canonicalRegistry(ep.host) == canonicalRegistry(domain) || ep.credentialDomain == canonicalRegistry(domain)
			if got != want {
				t.Fatalf("endpoint %d %s (credential_domain %q): credentials sent %v, want %v", i, ep, ep.credentialDomain, got, want)
			}
		}
	})
}
