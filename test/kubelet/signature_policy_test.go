package kubelet

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// A pod whose image the signature policy refuses.
const unsignedPod = `apiVersion: v1
kind: Pod
metadata:
  name: unsigned
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {{BUSYBOX}}
    command: [sleep, "3600"]
`

// A pod whose image is signed by the trusted key.
const signedPod = `apiVersion: v1
kind: Pod
metadata:
  name: signed
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: {{HTTPD}}
`

// TestKubeletSignaturePolicy: the kubelet shows berth's refusal of an
// unsigned image as the container's waiting reason
// SignatureValidationFailed, with berth's reason in the message (as with
// CRI-O), while an image signed by the trusted key (the signature served
// by the same mirror) runs (docs/signature-policy.md).
func TestKubeletSignaturePolicy(t *testing.T) {
	t.Parallel()
	berthdtest.RequireRoot(t)
	bins := k8sBins(t, "kubelet")
	key := testimages.NewCosignKey(t, "ecdsa")
	policy := filepath.Join(t.TempDir(), "policy.json")
	data := base64.StdEncoding.EncodeToString(key.PublicPEM)
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`{
	  "default": [{"type": "reject"}],
	  "transports": {"docker": {
	    %q: [{"type": "sigstoreSigned", "keyData": %q, "signedIdentity": {"type": "matchRepository"}}]
	  }}}`, registryHost, data)), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, bins, envOptions{Berthd: berthdtest.Options{Configure: func(c *config.Config) { c.SignaturePolicy = policy }}})
	httpd, err := testimages.HTTPD()
	dg, err := testimages.Must(t, httpd, err).Digest()
	if err != nil {
		t.Fatal(err)
	}
	payload := testimages.CosignPayload(t, registryHost+"/busybox-httpd", dg.String())
	e.reg.PushCosignSignatures(t, "busybox-httpd", dg.String(), testimages.CosignLayer{Payload: payload, Signature: key.Sign(t, payload)})

	k := e.k
	vars := map[string]string{"BUSYBOX": busyboxImage, "HTTPD": httpdImage}
	k.Apply(t, "unsigned", render(unsignedPod, vars))
	k.Apply(t, "signed", render(signedPod, vars))

	p := k.WaitPod(t, "unsigned", "waiting with SignatureValidationFailed", 2*time.Minute, func(p *corev1.Pod) bool {
		cs := ctrStatus(p, "main")
		return cs != nil && cs.State.Waiting != nil && cs.State.Waiting.Reason == "SignatureValidationFailed"
	})
	msg := ctrStatus(p, "main").State.Waiting.Message
	t.Logf("the kubelet shows: SignatureValidationFailed: %s", msg)
	for _, want := range []string{
		"image pull failed for " + busyboxImage + " because the signature validation failed",
		fmt.Sprintf("refused by signature policy scope docker %q", registryHost),
		"no signature",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("waiting message %q lacks %q", msg, want)
		}
	}
	p = k.WaitPod(t, "signed", "Ready", 3*time.Minute, podReady)
	t.Logf("signed pod ready, image %s", ctrStatus(p, "web").ImageID)

	for _, name := range []string{"unsigned", "signed"} {
		k.Delete(t, name)
	}
	for _, name := range []string{"unsigned", "signed"} {
		k.WaitGone(t, name, 2*time.Minute)
	}
}
