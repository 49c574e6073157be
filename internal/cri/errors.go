package cri

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthcri/berth/internal/errdefs"
)

// toStatus maps a domain error to a gRPC status error. It is the one place
// where error kinds become codes; RPC files return toStatus(err).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Unknown
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, errdefs.ErrAlreadyExists):
		code = codes.AlreadyExists
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = codes.InvalidArgument
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		code = codes.FailedPrecondition
	case errors.Is(err, errdefs.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, errdefs.ErrResourceExhausted):
		code = codes.ResourceExhausted
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

// invalidArgument builds an InvalidArgument status with a formatted message.
func invalidArgument(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}
