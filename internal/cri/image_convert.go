package cri

import (
	"strconv"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/image"
)

// toCRIImage converts a store image; uid or username come from the
// config's USER as containerd reports them (numeric → uid, name → username;
// a group after ':' is ignored).
func toCRIImage(img *image.Image) *runtime.Image {
	out := &runtime.Image{
		Id:          img.ID,
		RepoTags:    img.RepoTags,
		RepoDigests: img.RepoDigests,
		Size:        img.Size,
		// No runtime_handler: the image is every handler's. The kubelet
		// (RuntimeClassInImageCriApi) keys images by ID and this field and
		// in-use images by their containers' image spec, which names no
		// handler either, so the two keys agree.
		Spec:   &runtime.ImageSpec{Image: img.ID},
		Pinned: img.Pinned,
	}
	if img.Config != nil {
		user, _, _ := strings.Cut(img.Config.Config.User, ":")
		if user != "" {
			if uid, err := strconv.ParseInt(user, 10, 64); err == nil {
				out.Uid = &runtime.Int64Value{Value: uid}
			} else {
				out.Username = user
			}
		}
	}
	return out
}
