package errgrpc

import (
	"context"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestToGRPCMapsKindsThroughWrapping(t *testing.T) {
	for err, want := range map[error]codes.Code{
		fmt.Errorf("pod x: %w", errdefs.ErrNotFound):                                        codes.NotFound,
		fmt.Errorf("name: %w", errdefs.ErrAlreadyExists):                                    codes.AlreadyExists,
		fmt.Errorf("bad: %w", errdefs.ErrInvalidArgument):                                   codes.InvalidArgument,
		fmt.Errorf("state: %w", errdefs.ErrFailedPrecondition):                              codes.FailedPrecondition,
		fmt.Errorf("exec: %w", errdefs.ErrDeadlineExceeded):                                 codes.DeadlineExceeded,
		fmt.Errorf("pull: %w", context.DeadlineExceeded):                                    codes.DeadlineExceeded,
		fmt.Errorf("auth: %w", errdefs.ErrUnauthenticated):                                  codes.Unauthenticated,
		fmt.Errorf("slow: %w", errdefs.ErrResourceExhausted):                                codes.ResourceExhausted,
		fmt.Errorf("blob: %w", &fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}): codes.ResourceExhausted,
		fmt.Errorf("unpack: %w", syscall.EDQUOT):                                            codes.ResourceExhausted,
		fmt.Errorf("plain"):                                                                 codes.Unknown,
		status.Error(codes.Aborted, "already a status"):                                     codes.Aborted,
	} {
		if got := status.Code(ToGRPC(err)); got != want {
			t.Errorf("%v → %s, want %s", err, got, want)
		}
	}
	if ToGRPC(nil) != nil {
		t.Error("nil error mapped to a status")
	}
}
