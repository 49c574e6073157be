package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// Image signature policy (docs/signature-policy.md, decision 2400): cosign
// signatures made by keys the tests generate, pushed as cosign pushes them
// (the sha256-<hex>.sig tag) to the in-process registry.

// writeKey writes a public key PEM where a policy's keyPath can name it.
func writeKey(t *testing.T, dir, file string, k *testimages.CosignKey) string {
	t.Helper()
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, k.PublicPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func writePolicy(t *testing.T, path, policy string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantSignatureRefused checks a pull refused by the policy as CRI-O
// answers it, so that the kubelet shows SignatureValidationFailed: code
// Unknown, a message that starts with it and names the scope and why.
func wantSignatureRefused(t *testing.T, d *berthdtest.Daemon, ref string, wants ...string) {
	t.Helper()
	_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	if err == nil {
		t.Fatalf("pull %s: accepted, want it refused by the signature policy", ref)
	}
	st, _ := status.FromError(err)
	if st.Code() != codes.Unknown || !strings.HasPrefix(st.Message(), "SignatureValidationFailed: image "+ref) {
		t.Fatalf("pull %s: %v, want code Unknown and a message starting with SignatureValidationFailed: image %s", ref, err, ref)
	}
	for _, w := range wants {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("pull %s: message %q lacks %q", ref, st.Message(), w)
		}
	}
}

// wantStoreEmpty checks that nothing of any image is in the store.
func wantStoreEmpty(t *testing.T, d *berthdtest.Daemon) {
	t.Helper()
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Errorf("images after refusals: %v", imgs)
	}
	for _, sub := range []string{"blobs/sha256", "layers", "records", "ingest"} {
		if e := dirEntries(t, d, sub); len(e) != 0 {
			t.Errorf("%s after refusals: %v", sub, e)
		}
	}
}

// One registry scope requires a signature by one of two keys (ECDSA P-256
// and Ed25519). Unsigned, signed by another key, a signature for another
// digest and a tampered payload are refused, each with its reason and
// nothing stored; a repository scope that accepts anything wins over the
// registry's; images signed by either key are pulled, with the .sig tag
// or with a sigstore bundle attached as an OCI 1.1 referrer.
func TestSignaturePolicyCosignSignatures(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := mustImage(t, testimages.Busybox)
	other := mustImage(t, testimages.BusyboxUser)
	otherDigest, err := other.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ec := testimages.NewCosignKey(t, "ecdsa")
	ed := testimages.NewCosignKey(t, "ed25519")
	stranger := testimages.NewCosignKey(t, "ecdsa")

	push := func(repo string) string {
		return reg.Push(t, repo+":v1", img).String()
	}
	dg := push("signed/ec")
	reg.SignCosign(t, ec, "signed/ec", dg)
	reg.SignCosign(t, ed, "signed/ed", push("signed/ed"))
	push("unsigned/app")
	reg.SignCosign(t, stranger, "strangers/app", push("strangers/app"))
	// A good signature, but for another image's digest, under this one's tag.
	push("swapped/app")
	swapped := testimages.CosignPayload(t, reg.Ref("swapped/app"), otherDigest.String())
	reg.PushCosignSignatures(t, "swapped/app", dg, testimages.CosignLayer{Payload: swapped, Signature: ec.Sign(t, swapped)})
	// Signed for this digest, then the payload changed (now naming another
	// repository) while the signature stayed.
	push("tampered/app")
	payload := testimages.CosignPayload(t, reg.Ref("tampered/app"), dg)
	sig := ec.Sign(t, payload)
	reg.PushCosignSignatures(t, "tampered/app", dg, testimages.CosignLayer{
		Payload: testimages.CosignPayload(t, reg.Ref("elsewhere/app"), dg), Signature: sig,
	})
	push("open/app")
	// OCI 1.1 referrers: sigstore bundles, as cosign --new-bundle-format
	// attaches them.
	subject := testimages.DescriptorOf(t, img)
	push("bundled/app")
	reg.AttachBundle(t, "bundled/app", subject, ec.Bundle(t, testimages.BundleStatement(t, reg.Ref("bundled/app"), dg)))
	push("bundled-stranger/app")
	reg.AttachBundle(t, "bundled-stranger/app", subject, stranger.Bundle(t, testimages.BundleStatement(t, reg.Ref("bundled-stranger/app"), dg)))

	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.json")
	writePolicy(t, policy, fmt.Sprintf(`{
	  "default": [{"type": "reject"}],
	  "transports": {"docker": {
	    %q: [{"type": "sigstoreSigned", "keyPaths": [%q, %q], "signedIdentity": {"type": "matchRepository"}}],
	    %q: [{"type": "insecureAcceptAnything"}]
	  }}}`, reg.Host, writeKey(t, dir, "ec.pub", ec), writeKey(t, dir, "ed.pub", ed), reg.Host+"/open/app"))
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.SignaturePolicy = policy }})

	scope := fmt.Sprintf("scope docker %q", reg.Host)
	wantSignatureRefused(t, d, reg.Ref("unsigned/app:v1"), scope, "no signature", "sha256-")
	wantSignatureRefused(t, d, reg.Ref("strangers/app:v1"), scope, "does not verify with the trusted key", "ec.pub")
	wantSignatureRefused(t, d, reg.Ref("swapped/app:v1"), scope, "digest mismatch", otherDigest.String())
	wantSignatureRefused(t, d, reg.Ref("tampered/app:v1"), scope, "payload was changed after signing")
	wantSignatureRefused(t, d, reg.Ref("bundled-stranger/app:v1"), scope, "does not verify with the trusted key")
	wantSignatureRefused(t, d, "quay.io/berth-test/app:v1", "scope default", "rejects every image")
	wantStoreEmpty(t, d)

	id := configDigest(t, img)
	for _, ref := range []string{reg.Ref("signed/ec:v1"), reg.Ref("signed/ed:v1"), reg.Ref("signed/ec@" + dg), reg.Ref("open/app:v1"), reg.Ref("bundled/app:v1")} {
		if got := pull(t, d, ref, nil); got != id {
			t.Errorf("pull %s: %s, want %s", ref, got, id)
		}
	}
}

// A reload (SIGHUP) that tightens the policy file refuses the next pull;
// a policy file that does not parse is refused whole and the one in effect
// stays.
func TestSignaturePolicyReloadTightens(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := mustImage(t, testimages.Busybox)
	reg.Push(t, "app:v1", img)
	reg.Push(t, "app:v2", img)
	reg.Push(t, "app:v3", img)
	d := berthdtest.Start(t, berthdtest.Options{})

	// No policy file: anything is accepted, as without the feature.
	pull(t, d, reg.Ref("app:v1"), nil)

	k := testimages.NewCosignKey(t, "ecdsa")
	writePolicy(t, d.Config.SignaturePolicy, fmt.Sprintf(`{"default": [{"type": "sigstoreSigned", "keyPath": %q}]}`,
		writeKey(t, d.Dir, "cosign.pub", k)))
	last := d.Reload()
	wantResult(t, last, "success")
	if c := lastChanges(t, last)["signature_policy"]; c == nil || c["applied"] != true || !strings.Contains(c["new"].(string), "sha256:") {
		t.Fatalf("signature_policy change: %+v", last)
	}
	wantSignatureRefused(t, d, reg.Ref("app:v2"), "scope default", "no signature")
	out, err := exec.Command(berthdtest.Binary(t), "config", "--running", "--listen", "unix://"+d.Socket).CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("# signature policy: %s (sha256:", d.Config.SignaturePolicy)) {
		t.Errorf("berthd config --running does not show the policy in effect (%v):\n%s", err, out)
	}

	writePolicy(t, d.Config.SignaturePolicy, `{"default": [{"type": "insecureAcceptAnything"}], "oops"}`)
	last = d.Reload()
	wantResult(t, last, "failure")
	if e, _ := last["error"].(string); !strings.Contains(e, "signature policy") {
		t.Errorf("reload error %q does not name the signature policy", e)
	}
	wantSignatureRefused(t, d, reg.Ref("app:v3"), "scope default", "no signature")
	if !strings.Contains(d.Logs(), "configuration reload refused") {
		t.Errorf("log does not say the reload was refused")
	}
}

// berthctl image import follows the policy: an archive carries no
// signature berth reads, so an image whose scope requires one is refused
// (nothing stored), while a scope that accepts anything lets it in.
func TestSignaturePolicyImport(t *testing.T) {
	t.Parallel()
	k := testimages.NewCosignKey(t, "ecdsa")
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.json")
	writePolicy(t, policy, fmt.Sprintf(`{
	  "default": [{"type": "sigstoreSigned", "keyPath": %q}],
	  "transports": {"docker": {"example.com/offline": [{"type": "insecureAcceptAnything"}]}}}`,
		writeKey(t, dir, "cosign.pub", k)))
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.SignaturePolicy = policy }})
	img := mustImage(t, testimages.Busybox)

	archive := func(ref string) string {
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "image.tar")
		if err := tarball.WriteToFile(p, tag, img); err != nil {
			t.Fatal(err)
		}
		return p
	}
	out, err := runCtl(t, d, "image", "import", archive("example.com/signed-only/app:v1"))
	if err == nil || !strings.Contains(out, "refused by signature policy scope default") || !strings.Contains(out, "imported archive") {
		t.Fatalf("import under a sigstoreSigned scope: %v\n%s", err, out)
	}
	if !strings.Contains(out, "FailedPrecondition") {
		t.Errorf("import refusal is not FailedPrecondition: %s", out)
	}
	wantStoreEmpty(t, d)
	if out, err := runCtl(t, d, "image", "import", archive("example.com/offline/app:v1")); err != nil {
		t.Fatalf("import under an accepting scope: %v\n%s", err, out)
	}
	if st := imageStatus(t, d, "example.com/offline/app:v1"); st == nil || st.Id != configDigest(t, img) {
		t.Fatalf("imported image: %+v", st)
	}
}
