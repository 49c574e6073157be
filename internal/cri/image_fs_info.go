package cri

import (
	"context"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ImageFsInfo reports two filesystems (KEP-4191): the image store
// (<root>/images: blobs and unpacked layers) and the containers' writable
// layers (<root>/containers), each identified by its directory, which the
// kubelet resolves to a device. The kubelet treats them as one filesystem
// when both resolve to the same device, and as split image and container
// filesystems when an operator mounted one of them elsewhere.
func (s *Service) ImageFsInfo(ctx context.Context, req *runtime.ImageFsInfoRequest) (*runtime.ImageFsInfoResponse, error) {
	u, err := s.images.Usage()
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &runtime.ImageFsInfoResponse{ImageFilesystems: []*runtime.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtime.FilesystemIdentifier{Mountpoint: s.images.Dir()},
		UsedBytes:  &runtime.UInt64Value{Value: u.Bytes},
		InodesUsed: &runtime.UInt64Value{Value: u.Inodes},
	}}}
	if s.containers != nil {
		cu, err := s.containers.DiskUsage()
		if err != nil {
			return nil, toStatus(err)
		}
		resp.ContainerFilesystems = []*runtime.FilesystemUsage{{
			Timestamp:  time.Now().UnixNano(),
			FsId:       &runtime.FilesystemIdentifier{Mountpoint: s.containers.Dir()},
			UsedBytes:  &runtime.UInt64Value{Value: cu.Bytes},
			InodesUsed: &runtime.UInt64Value{Value: cu.Inodes},
		}}
	}
	return resp, nil
}

// writableLayerFs identifies the filesystem of containers' writable layers
// in container stats and metrics: the container filesystem of ImageFsInfo.
func (s *Service) writableLayerFs() string {
	if s.containers != nil {
		return s.containers.Dir()
	}
	return s.images.Dir()
}
