package cri

import (
	"slices"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkImageHandler validates ImageSpec.runtime_handler (KEP-4216) for the
// image RPCs. berth keeps one image for all its runtime handlers (decision
// 1502): they differ only in the OCI runtime binary and all run
// linux/GOARCH containers on overlayfs layers, so an image pulled for one
// handler is the image every other handler would pull. A handler berth
// does not have is refused, as the CRI asks and containerd answers:
// InvalidArgument.
func (s *Service) checkImageHandler(spec *runtime.ImageSpec) error {
	h := spec.GetRuntimeHandler()
	if h == "" {
		return nil
	}
	var known []string
	if s.live != nil {
		known = s.live.Load().HandlerNames()
	}
	if slices.Contains(known, h) {
		return nil
	}
	return invalidArgument("image runtime handler %q is not configured (runtime_handlers has %v)", h, known)
}
