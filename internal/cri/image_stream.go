package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StreamImages sends what ListImages returns for the same filter, in
// responses of at least one image each (KEP-5825). Images are few (the
// store lists them all under its lock anyway), so this batches
// ListImages' own answer.
func (s *Service) StreamImages(req *runtime.StreamImagesRequest, stream runtime.ImageService_StreamImagesServer) error {
	resp, err := s.ListImages(stream.Context(), &runtime.ListImagesRequest{Filter: req.GetFilter()})
	if err != nil {
		return err
	}
	b := newBatcher(stream.Context(), func(items []*runtime.Image) error {
		return stream.Send(&runtime.StreamImagesResponse{Images: items})
	})
	for _, img := range resp.GetImages() {
		if err := b.add(img); err != nil {
			return err
		}
	}
	return b.flush()
}
