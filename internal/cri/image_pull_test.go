package cri

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	crierrors "k8s.io/cri-api/pkg/errors"

	"github.com/berthcri/berth/internal/image"
)

// The kubelet recognizes a signature refusal only as code Unknown (its
// CRI client strips it) with a message that starts with cri-api's
// SignatureValidationFailed, which is what CRI-O answers.
func TestSignatureRefusalIsWhatTheKubeletRecognizes(t *testing.T) {
	se := &image.SignatureError{Image: "example.com/app:v1", Digest: "sha256:abc", Scope: `docker "example.com"`, Reason: "no signature"}
	wrapped := fmt.Errorf("pull example.com/app:v1: %w", se)
	got, ok := image.AsSignatureError(wrapped)
	if !ok || got != se {
		t.Fatalf("AsSignatureError(%v) = %v, %v", wrapped, got, ok)
	}
	st, _ := status.FromError(signatureRefused(got))
	if st.Code() != codes.Unknown {
		t.Errorf("code %s, want Unknown", st.Code())
	}
	// What the kubelet's image manager does with the stripped message.
	msg := errors.New(st.Message()).Error()
	if !strings.HasPrefix(msg, crierrors.ErrSignatureValidationFailed.Error()+": ") {
		t.Errorf("message %q does not start with %s", msg, crierrors.ErrSignatureValidationFailed)
	}
	want := `image example.com/app:v1 (sha256:abc) refused by signature policy scope docker "example.com": no signature`
	if rest := strings.TrimPrefix(msg, crierrors.ErrSignatureValidationFailed.Error()+": "); rest != want {
		t.Errorf("reason %q, want %q", rest, want)
	}
}
