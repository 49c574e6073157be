package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// cosignCLI runs the cosign program named (cosign-v2, cosign-v3) from
// $BERTH_COSIGN_DIR, which hack/cosign-bins.sh fills and `make test` sets.
// Keys are read without a password, and nothing reaches a transparency
// log or Fulcio: the test is offline.
func cosignCLI(t *testing.T, dir, prog string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(os.Getenv("BERTH_COSIGN_DIR"), prog), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=", "HOME="+dir, "TUF_ROOT="+filepath.Join(dir, "tuf"), "SIGSTORE_NO_CACHE=true")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", prog, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Signatures made by the cosign CLI itself, not by the test's own signer:
// cosign v2's `sign --key` and cosign v3's with --new-bundle-format=false
// (the sha256-<hex>.sig tag), and cosign v3's default new bundle format (a
// sigstore bundle attached as an OCI 1.1 referrer, naming the digest only), with a key pair from `cosign generate-key-pair`, both
// pushed to the in-process registry with no transparency log. berth
// accepts what the trusted key signed with an identity, refuses what
// another key signed, and refuses cosign v3's bundle, which claims no
// identity (issue 34).
// The other way round, cosign v2 verifies a signature made by the test
// helpers that the other signature tests use, so those are cosign's shape.
func TestSignaturePolicyCosignCLI(t *testing.T) {
	if os.Getenv("BERTH_COSIGN_DIR") == "" {
		t.Skip("BERTH_COSIGN_DIR is unset: run through make test, which builds cosign with hack/cosign-bins.sh")
	}
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := mustImage(t, testimages.Busybox)
	keys, stranger := t.TempDir(), t.TempDir()
	cosignCLI(t, keys, "cosign-v2", "generate-key-pair")
	cosignCLI(t, stranger, "cosign-v2", "generate-key-pair")

	registryFlags := []string{"--allow-http-registry", "--allow-insecure-registry"}
	sign := func(prog, keyDir, repo string, extra ...string) {
		dg := reg.Push(t, repo+":v1", img).String()
		args := append([]string{"sign", "--yes", "--key", filepath.Join(keyDir, "cosign.key"), "--tlog-upload=false"}, registryFlags...)
		args = append(append(args, extra...), reg.Ref(repo)+"@"+dg)
		cosignCLI(t, keyDir, prog, args...)
	}
	sign("cosign-v2", keys, "v2/app")
	sign("cosign-v3", keys, "v3/app", "--new-bundle-format", "--use-signing-config=false")
	sign("cosign-v3", keys, "v3-sig-tag/app", "--new-bundle-format=false", "--use-signing-config=false")
	sign("cosign-v2", stranger, "stranger-v2/app")
	sign("cosign-v3", stranger, "stranger-v3/app", "--new-bundle-format", "--use-signing-config=false")
	reg.Push(t, "unsigned/app:v1", img)

	// The test helpers' signature, checked by cosign itself.
	helperKey := testimages.NewCosignKey(t, "ecdsa")
	helperDigest := reg.Push(t, "helper/app:v1", img).String()
	reg.SignCosign(t, helperKey, "helper/app", helperDigest)
	helperPub := writeKey(t, t.TempDir(), "helper.pub", helperKey)
	cosignCLI(t, keys, "cosign-v2", append([]string{"verify", "--key", helperPub, "--insecure-ignore-tlog"}, append(registryFlags, reg.Ref("helper/app")+"@"+helperDigest)...)...)

	policy := filepath.Join(t.TempDir(), "policy.json")
	writePolicy(t, policy, fmt.Sprintf(`{
	  "default": [{"type": "reject"}],
	  "transports": {"docker": {
	    %q: [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": {"type": "matchRepository"}}]
	  }}}`, reg.Host, filepath.Join(keys, "cosign.pub")))
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.SignaturePolicy = policy }})

	scope := fmt.Sprintf("scope docker %q", reg.Host)
	wantSignatureRefused(t, d, reg.Ref("unsigned/app:v1"), scope, "no signature")
	wantSignatureRefused(t, d, reg.Ref("stranger-v2/app:v1"), scope, "does not verify with the trusted key")
	wantSignatureRefused(t, d, reg.Ref("stranger-v3/app:v1"), scope, "does not verify with the trusted key")
	// cosign v3's statement names the digest alone: no identity for
	// matchRepository to match (issue 34).
	wantSignatureRefused(t, d, reg.Ref("v3/app:v1"), scope, "claims no identity")
	wantStoreEmpty(t, d)
	id := configDigest(t, img)
	for _, ref := range []string{reg.Ref("v2/app:v1"), reg.Ref("v3-sig-tag/app:v1")} {
		if got := pull(t, d, ref, nil); got != id {
			t.Errorf("pull %s: %s, want %s", ref, got, id)
		}
	}
}
