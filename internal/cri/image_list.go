package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// ListImages lists images; a filter with an image reference narrows the
// list to the image it names (none when it names nothing).
func (s *Service) ListImages(ctx context.Context, req *runtime.ListImagesRequest) (*runtime.ListImagesResponse, error) {
	resp := &runtime.ListImagesResponse{Images: []*runtime.Image{}}
	if err := s.checkImageHandler(req.GetFilter().GetImage()); err != nil {
		return nil, err
	}
	if ref := req.GetFilter().GetImage().GetImage(); ref != "" {
		img, err := s.images.Get(ref)
		if errdefs.IsNotFound(err) {
			return resp, nil
		}
		if err != nil {
			return nil, toStatus(err)
		}
		resp.Images = append(resp.Images, toCRIImage(img))
		return resp, nil
	}
	for _, img := range s.images.List() {
		resp.Images = append(resp.Images, toCRIImage(img))
	}
	return resp, nil
}
