package cri

import (
	"context"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ImageFsInfo reports the bytes and inodes the image store uses, with the
// store directory as the mountpoint.
func (s *Service) ImageFsInfo(ctx context.Context, req *runtime.ImageFsInfoRequest) (*runtime.ImageFsInfoResponse, error) {
	u, err := s.images.Usage()
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ImageFsInfoResponse{ImageFilesystems: []*runtime.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtime.FilesystemIdentifier{Mountpoint: s.images.Dir()},
		UsedBytes:  &runtime.UInt64Value{Value: u.Bytes},
		InodesUsed: &runtime.UInt64Value{Value: u.Inodes},
	}}}, nil
}
