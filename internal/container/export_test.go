package container_test

import (
	"context"
	"path/filepath"

	"github.com/berthcri/berth/internal/shim"
)

// shimAttachClose closes a container's stdin through the node's monitor, with no
// Store involved (as if berthd were down).
func shimAttachClose(f *fixture, pod, id string) (*shim.Stream, error) {
	s, err := shim.NewClient(filepath.Join(f.opts.ShimDir, pod)).Attach(context.Background(), id, true, false, false)
	if err != nil {
		return nil, err
	}
	if err := s.CloseStdin(); err != nil {
		return nil, err
	}
	return s, s.Close()
}
