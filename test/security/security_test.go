// Package security holds berth's hostile tests (issue 34): each test plays
// an attacker — an unprivileged host user, a hostile image, registry,
// archive or CRI client — against a real berthd, and proves one row of
// docs/security.md. Each test is built so that it fails on a berthd
// without the defence it names. Tests need root; the host user is
// `nobody`.
package security

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ctxT is a test's context: two minutes, cancelled when the test ends.
func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails the test unless err carries the gRPC code want.
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got code %s (%v), want %s", got, err, want)
	}
}
