package container

import (
	"context"
	"fmt"

	"github.com/berthcri/berth/internal/shim"
)

// ShimState asks the node's monitor, on the pod's socket, how it sees the
// container: pid, status, and the CRI log records it could not write (a full
// disk). It is an RPC to the monitor, unlike Get: for verbose status and
// metrics, not the kubelet's polling.
func (s *Store) ShimState(ctx context.Context, id string) (*shim.State, error) {
	e, err := s.entry(id)
	if err != nil {
		return nil, err
	}
	r := e.Published()
	st, err := s.shims.Pod(r.PodID).State(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("shim state of %s: %w", r.ID, err)
	}
	return st, nil
}
