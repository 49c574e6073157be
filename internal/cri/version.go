package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeName is what Version reports as the runtime's name.
const RuntimeName = "berth"

// Version reports the runtime and CRI API versions. The request's version
// field is the caller's API version; v1 is the only one berth speaks.
func (s *Service) Version(ctx context.Context, req *runtime.VersionRequest) (*runtime.VersionResponse, error) {
	return &runtime.VersionResponse{
		Version:           "0.1.0",
		RuntimeName:       RuntimeName,
		RuntimeVersion:    s.version,
		RuntimeApiVersion: "v1",
	}, nil
}
