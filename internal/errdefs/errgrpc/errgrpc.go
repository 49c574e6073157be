// Package errgrpc maps errdefs kinds to gRPC status codes. It is apart from
// errdefs so that berth-shim, which uses errdefs, links no gRPC or protobuf
// (their package init and data would cost the node's keeper and monitor
// memory).
package errgrpc

import (
	"context"
	"errors"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/berthcri/berth/internal/errdefs"
)

// ToGRPC maps an error to a gRPC status error: the one place error kinds
// become codes, shared by the CRI and admin services. Errors that already
// carry a status pass through.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}

// Code is the gRPC code for err's kind; Unknown when it has none.
func Code(err error) codes.Code {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return codes.InvalidArgument
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, errdefs.ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return codes.Unauthenticated
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return codes.ResourceExhausted
	// A full disk or an exhausted quota is gRPC's ResourceExhausted ("perhaps
	// the entire file system is out of space"), so the kubelet's pull backoff
	// and an operator see what to free instead of Unknown.
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return codes.ResourceExhausted
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Unknown
}
