package container

import (
	"context"
	"fmt"
	"time"

	"github.com/berthcri/berth/internal/shim"
)

// ShimState asks the node's monitor, on the pod's socket, how it sees the
// container: pid, status, and the CRI log records it could not write (a full
// disk). It is an RPC to the monitor, unlike Get: for verbose status and
// metrics, not the kubelet's polling. It waits at most ShimStateTimeout
// whatever ctx allows: its callers are reads, which answer from the
// last known state without it when the monitor hangs (decision 3300).
func (s *Store) ShimState(ctx context.Context, id string) (*shim.State, error) {
	e, err := s.entry(id)
	if err != nil {
		return nil, err
	}
	r := e.Published()
	ctx, cancel := context.WithTimeout(ctx, ShimStateTimeout)
	defer cancel()
	st, err := s.shims.Pod(r.PodID).State(ctx, r.ID)
	if err != nil {
		return nil, fmt.Errorf("shim state of %s: %w", r.ID, err)
	}
	return st, nil
}

// ShimStateTimeout bounds ShimState: a healthy monitor answers a state in
// well under a millisecond, and a read RPC that asks it must still answer
// within its 1 s bound (docs/reliability.md) when the monitor hangs.
const ShimStateTimeout = 300 * time.Millisecond
