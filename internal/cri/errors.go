package cri

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	crierrors "k8s.io/cri-api/pkg/errors"

	"github.com/berthcri/berth/internal/errdefs/errgrpc"
	"github.com/berthcri/berth/internal/events"
	"github.com/berthcri/berth/internal/image"
)

// This file is the one place of the CRI layer where errors become gRPC
// codes: RPC files return toStatus(err) for what a domain package
// answered, or one of the constructors below.

// toStatus maps a domain error to a gRPC status error (errgrpc.ToGRPC).
func toStatus(err error) error { return errgrpc.ToGRPC(err) }

// invalidArgument builds an InvalidArgument status with a formatted message.
func invalidArgument(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}

// eventsFellBehind ends a GetContainerEvents stream whose client fell more
// than events.DefaultBuffer events behind: ResourceExhausted, so it knows
// to relist.
func eventsFellBehind() error {
	return status.Error(codes.ResourceExhausted, fmt.Sprintf("event subscriber fell more than %d events behind; relist and subscribe again", events.DefaultBuffer))
}

// signatureRefused is a pull the signature policy refused, as CRI-O
// answers it and the kubelet recognizes it: code Unknown (which the
// kubelet's CRI client strips) and a message that starts with the
// cri-api's SignatureValidationFailed, so that the pod's waiting reason
// is SignatureValidationFailed with berth's reason after it (decision
// 2400).
func signatureRefused(se *image.SignatureError) error {
	return status.Error(codes.Unknown, crierrors.ErrSignatureValidationFailed.Error()+": "+se.Message())
}
