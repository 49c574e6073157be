package cri

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthcri/berth/internal/errdefs/errgrpc"
)

// toStatus maps a domain error to a gRPC status error (errgrpc.ToGRPC);
// RPC files return toStatus(err).
func toStatus(err error) error { return errgrpc.ToGRPC(err) }

// invalidArgument builds an InvalidArgument status with a formatted message.
func invalidArgument(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}
