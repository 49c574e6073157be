package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkSignaturePolicy measures what the image signature policy
// (docs/signature-policy.md) adds to a pull: the same multi-layer image
// pulled from a repository whose scope accepts anything and from one whose
// scope requires a cosign signature (found by its sha256-<hex>.sig tag,
// verified offline with an ECDSA P-256 key), alternating sample by sample
// on one berthd. Cold pulls fetch and unpack every layer; warm pulls find
// the image stored and only resolve (and verify) again.
func BenchmarkSignaturePolicy(b *testing.B) {
	if !selected(os.Getenv("BENCH_WORKLOADS"), "signature policy") {
		b.Skip("not selected by BENCH_WORKLOADS")
	}
	reg := testimages.StartRegistry(b)
	img, err := testimages.MultiLayer()
	if err != nil {
		b.Fatal(err)
	}
	key := testimages.NewCosignKey(b, "ecdsa")
	dg := reg.Push(b, "signed/app:v1", img).String()
	reg.SignCosign(b, key, "signed/app", dg)
	reg.Push(b, "open/app:v1", img)

	dir := b.TempDir()
	pub := filepath.Join(dir, "cosign.pub")
	if err := os.WriteFile(pub, key.PublicPEM, 0o644); err != nil {
		b.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`{
	  "default": [{"type": "insecureAcceptAnything"}],
	  "transports": {"docker": {%q: [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": {"type": "matchRepository"}}]}}}`,
		reg.Host+"/signed", pub)), 0o644); err != nil {
		b.Fatal(err)
	}
	d := berthdtest.Start(b, berthdtest.Options{Configure: func(c *config.Config) { c.SignaturePolicy = policy }})
	ctx := context.Background()

	type variant struct {
		ref        string
		cold, warm Series
	}
	vs := []*variant{
		{ref: reg.Ref("open/app:v1"), cold: Series{Name: "cold pull, scope accepts anything"}, warm: Series{Name: "warm pull, scope accepts anything"}},
		{ref: reg.Ref("signed/app:v1"), cold: Series{Name: "cold pull, cosign signature verified"}, warm: Series{Name: "warm pull, cosign signature verified"}},
	}
	pull := func(ref string) time.Duration {
		start := time.Now()
		if _, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
			b.Fatalf("pull %s: %v", ref, err)
		}
		return time.Since(start)
	}
	for i := 0; i < 10; i++ {
		for _, v := range vs {
			// Both tags name one image: remove it whole so the pull is cold.
			for _, r := range vs {
				if _, err := d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: r.ref}}); err != nil {
					b.Fatal(err)
				}
			}
			v.cold.Samples = append(v.cold.Samples, pull(v.ref))
			v.warm.Samples = append(v.warm.Samples, pull(v.ref))
		}
	}
	if err := Report(os.Stdout, "signature_policy", vs[0].cold, vs[1].cold, vs[0].warm, vs[1].warm); err != nil {
		b.Fatal(err)
	}
}
