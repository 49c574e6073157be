package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/image"
)

// PullImage pulls an image for linux/GOARCH and returns its ID (the config
// digest). The request's deadline bounds the pull. Every runtime handler
// shares the image (checkImageHandler).
func (s *Service) PullImage(ctx context.Context, req *runtime.PullImageRequest) (*runtime.PullImageResponse, error) {
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, invalidArgument("PullImage: image reference is required")
	}
	if err := s.checkImageHandler(req.GetImage()); err != nil {
		return nil, err
	}
	var auth *image.Auth
	if a := req.GetAuth(); a != nil {
		// The credentials go only to the registry server_address names
		// (the image's own when empty), never to a mirror that has not
		// opted in (image.Auth.ServerAddress). One whose destination
		// cannot be told is refused, as containerd's ParseAuth does.
		if a.ServerAddress != "" {
			if _, err := image.ServerAddressHost(a.ServerAddress); err != nil {
				return nil, invalidArgument("PullImage: auth: %v", err)
			}
		}
		auth = &image.Auth{
			Username: a.Username, Password: a.Password, Auth: a.Auth,
			IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken,
			ServerAddress: a.ServerAddress,
		}
	}
	img, err := s.images.Pull(ctx, ref, auth)
	if se, ok := image.AsSignatureError(err); ok {
		return nil, signatureRefused(se)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.PullImageResponse{ImageRef: img.ID}, nil
}
