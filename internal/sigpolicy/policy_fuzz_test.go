package sigpolicy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// FuzzParse feeds hostile policy.json files to the parser. Invariants: no
// panic; a policy that parses has a digest, answers Match, Precheck and
// Check for any reference without panicking, and a sigstoreSigned
// requirement never accepts an image without signatures. Key paths are
// relative to a directory that holds one valid key (key.pub); the fuzzer
// may name any file, which readConfigFile bounds (regular files only, 64
// KiB). `make fuzz` runs it for FUZZTIME.
func FuzzParse(f *testing.F) {
	k := testimages.NewCosignKey(f, "ecdsa")
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "key.pub"), k.PublicPEM, 0o644); err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		`{"default": [{"type": "insecureAcceptAnything"}]}`,
		`{"default": [{"type": "reject"}], "transports": {"docker": {"": [{"type": "insecureAcceptAnything"}]}}}`,
		`{"default": [{"type": "reject"}], "transports": {"docker": {"registry.example.com": [{"type": "sigstoreSigned", "keyPath": "key.pub", "signedIdentity": {"type": "matchRepository"}}], "*.example.com": [{"type": "reject"}]}, "docker-daemon": {"": [{"type": "insecureAcceptAnything"}]}}}`,
		fmt.Sprintf(`{"default": [{"type": "sigstoreSigned", "keyData": %q, "signedIdentity": {"type": "exactRepository", "dockerRepository": "example.com/b"}}]}`, keyData(k)),
		`{"default": [{"type": "sigstoreSigned", "keyPaths": ["key.pub", "/dev/zero"]}]}`,
		`{"default": [{"type": "sigstoreSigned", "keyPath": "key.pub", "signedIdentity": {"type": "remapIdentity", "prefix": "mirror.local:5000/vendor", "signedPrefix": "vendor.example.com"}}]}`,
		`{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "key.gpg"}]}`,
		`{"default": []}`,
		`{"default": [{"type": "reject"}]} {}`,
		`{"default": [{"type": "reject"}], "transports": {"docker": {"busybox:latest": [{"type": "reject"}]}}}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
	} {
		f.Add(seed)
	}
	refs := []string{"registry.example.com/app:v1", "a.b.example.com/x/y@sha256:" + fmt.Sprintf("%064x", 1), "docker.io/library/busybox:latest", "mirror.local:5000/vendor/prod/img:1.0"}
	f.Fuzz(func(t *testing.T, data string) {
		if len(data) > maxPolicySize {
			return // refused before parsing (readConfigFile)
		}
		p, err := Parse([]byte(data), dir)
		if err != nil {
			return
		}
		if p.Digest == "" {
			t.Fatal("a parsed policy has no digest")
		}
		for _, r := range refs {
			n, err := image.ParseReference(r)
			if err != nil {
				t.Fatal(err)
			}
			sc := p.Match(n)
			_ = p.Precheck(n)
			err = p.Check(context.Background(), image.SignatureCheck{Ref: n, Digest: "sha256:" + fmt.Sprintf("%064x", 2)})
			for _, req := range sc.Requirements {
				if (req.Type == TypeSigstoreSigned || req.Type == TypeReject) && err == nil {
					t.Fatalf("scope %s requires %s, yet an image without signatures passed", sc.Name, req.Type)
				}
			}
		}
		_ = p.Match(image.Named{})
	})
}
