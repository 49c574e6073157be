package security

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// A hostile registry (or anyone who can push to repository B) copies a
// cosign v3 signature made for repository A's image to B: the sigstore
// bundle's statement names the digest alone, no identity. B's scope
// requires a signature by the same key for exactRepository B; the
// signature must not stand for B, since the key never said anything about
// B (containers/image keeps the signed digest and the signed identity
// apart). A bundle whose statement names B is still pulled.
func TestSignatureIdentityRequiredForBundles(t *testing.T) {
	reg := testimages.StartRegistry(t)
	img, err := testimages.Busybox()
	img = testimages.Must(t, img, err)
	key := testimages.NewCosignKey(t, "ecdsa")
	subject := testimages.DescriptorOf(t, img)

	// Signed for A (cosign v3: the digest only), then the same bundle
	// attached to the same content pushed to B.
	dg := reg.Push(t, "team-a/app:v1", img).String()
	v3 := key.Bundle(t, testimages.CosignV3Statement(t, dg))
	reg.AttachBundle(t, "team-a/app", subject, v3)
	reg.Push(t, "team-b/app:v1", img)
	reg.AttachBundle(t, "team-b/app", subject, v3)
	// The control: a bundle that names its repository.
	reg.Push(t, "team-c/app:v1", img)
	reg.AttachBundle(t, "team-c/app", subject, key.Bundle(t, testimages.BundleStatement(t, reg.Ref("team-c/app"), dg)))

	dir := t.TempDir()
	pub := filepath.Join(dir, "key.pub")
	if err := os.WriteFile(pub, key.PublicPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.json")
	scope := func(repo, identity string) string {
		return fmt.Sprintf(`%q: [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": %s}]`, reg.Ref(repo), pub, identity)
	}
	doc := fmt.Sprintf(`{"default": [{"type": "reject"}], "transports": {"docker": {%s, %s, %s}}}`,
		scope("team-b/app", fmt.Sprintf(`{"type": "exactRepository", "dockerRepository": %q}`, reg.Ref("team-b/app"))),
		scope("team-a/app", `{"type": "matchRepository"}`),
		scope("team-c/app", fmt.Sprintf(`{"type": "exactRepository", "dockerRepository": %q}`, reg.Ref("team-c/app"))))
	if err := os.WriteFile(policy, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.SignaturePolicy = policy }})

	for _, tc := range []struct {
		ref  string
		want string // "" pulled, else a part of the refusal
	}{
		{reg.Ref("team-b/app:v1"), "claims no identity"},
		{reg.Ref("team-a/app:v1"), "claims no identity"},
		{reg.Ref("team-c/app:v1"), ""},
	} {
		_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: tc.ref}})
		if tc.want == "" {
			if err != nil {
				t.Errorf("pull %s: %v, want it pulled (its bundle names the repository)", tc.ref, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("pull %s: accepted on a signature that names no repository, want SignatureValidationFailed", tc.ref)
			continue
		}
		st, _ := status.FromError(err)
		if st.Code() != codes.Unknown || !strings.HasPrefix(st.Message(), "SignatureValidationFailed:") || !strings.Contains(st.Message(), tc.want) {
			t.Errorf("pull %s: %v, want SignatureValidationFailed naming %q", tc.ref, err, tc.want)
		}
	}
}
