package cri

import (
	"context"
	"log/slog"

	"github.com/berthcri/berth/internal/sandbox"
)

// nriStopPod reports a pod's stop to NRI plugins after its containers
// stopped: every container's stop first (the ones that exited on their own
// were reported already and are skipped), then the pod's. Plugin errors
// are logged: a stop is not refused.
func (s *Service) nriStopPod(ctx context.Context, sb *sandbox.Sandbox) {
	if !s.nri.Enabled() {
		return
	}
	for _, c := range s.containers.ListPod(sb.ID) {
		logNRI(s.log, s.nri.StopContainer(ctx, c), sb.ID, c.ID)
	}
	if cur, err := s.sandboxes.Get(sb.ID); err == nil {
		sb = cur
	}
	logNRI(s.log, s.nri.StopPodSandbox(ctx, sb), sb.ID, "")
}

// logNRI logs a failed NRI notification that does not fail the RPC.
func logNRI(log *slog.Logger, err error, podID, containerID string) {
	if err != nil {
		log.Warn("NRI notification failed", "pod", podID, "container", containerID, "err", err)
	}
}
