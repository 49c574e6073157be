package berthdtest

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Ctx is the context for a test's CRI calls: ten minutes, a bound far
// above any call's (so that a hang fails the test instead of CI's
// timeout), cancelled when the test ends. Tests share one Ctx across many
// calls and waits, and a whole test in the cgroup v2 guest's TCG beside
// other work takes minutes (docs/reliability.md, "CI beside a CPU-bound
// job").
func Ctx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// WantCode fails the test unless err carries the gRPC code want.
func WantCode(tb testing.TB, err error, want codes.Code) {
	tb.Helper()
	if got := status.Code(err); got != want {
		tb.Fatalf("got code %s (%v), want %s", got, err, want)
	}
}
