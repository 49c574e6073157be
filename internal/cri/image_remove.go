package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RemoveImage removes the image a reference (ID, tag or digest) names, with
// all its tags and digests, as containerd does. Removing an absent image
// succeeds. Layers stay while a container uses them.
func (s *Service) RemoveImage(ctx context.Context, req *runtime.RemoveImageRequest) (*runtime.RemoveImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalidArgument("RemoveImage: image reference is required")
	}
	// The image is every handler's (checkImageHandler): removing it for
	// one removes it for all, as containerd does.
	if err := s.checkImageHandler(req.GetImage()); err != nil {
		return nil, err
	}
	if err := s.images.Remove(ref); err != nil {
		return nil, toStatus(err)
	}
	return &runtime.RemoveImageResponse{}, nil
}
