package cri

import (
	"context"
	"encoding/json"
	"fmt"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

// ImageStatus returns the image a reference names, or a nil image (not an
// error) when there is none. Verbose adds info["info"], a JSON object with
// the record and the image config ("imageSpec", as containerd names it).
func (s *Service) ImageStatus(ctx context.Context, req *runtime.ImageStatusRequest) (*runtime.ImageStatusResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalidArgument("ImageStatus: image reference is required")
	}
	if err := s.checkImageHandler(req.GetImage()); err != nil {
		return nil, err
	}
	img, err := s.images.Get(ref)
	if errdefs.IsNotFound(err) {
		return &runtime.ImageStatusResponse{}, nil
	}
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &runtime.ImageStatusResponse{Image: toCRIImage(img)}
	if req.GetVerbose() {
		info, err := json.Marshal(map[string]any{
			"id":          img.ID,
			"repoTags":    img.RepoTags,
			"repoDigests": img.RepoDigests,
			"chainIDs":    img.ChainIDs,
			"size":        img.Size,
			"pinned":      img.Pinned,
			"imageSpec":   img.Config,
		})
		if err != nil {
			return nil, toStatus(fmt.Errorf("encode image info: %w", err))
		}
		resp.Info = map[string]string{"info": string(info)}
	}
	return resp, nil
}
