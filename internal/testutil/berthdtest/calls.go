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
// calls and waits; in the cgroup v2 guest's TCG beside a CPU-bound job a
// whole test took 210 s (TestStatsContainersAndPod, whose calls then ran
// past the two minutes this bound used to be).
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
