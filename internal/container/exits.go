package container

import (
	"context"
	"errors"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
)

// How berthd learns that a container exited: the node's keeper reaps it and
// the monitor persists its exit status; a watcher per container hears it at
// once (watch), and anything that looks at a container folds in an exit the
// watcher has not recorded yet (foldExit). Only an exit the node's monitor
// or keeper reports is an exit: a monitor that crashes is restarted by its
// keeper, and the shim client waits for it (decision 1701), so the container
// stays as it was meanwhile. A shim that is gone for good (no keeper, or no
// monitor within shim.MonitorRestartTimeout) can report nothing any more:
// the container is recorded exited, 255, its processes killed first if they
// still run (exitedIfShimGone), so that none runs on unseen while the
// kubelet starts its replacement.

// startWatch watches e for its exit until it exits or the store closes.
func (s *Store) startWatch(e *entry) {
	s.watchers.Add(1)
	go func() {
		defer s.watchers.Done()
		s.watch(e)
	}()
}

// watchRetry is how long a watcher waits before asking again after an
// error that says neither "exited" nor "gone" (a malformed answer).
const watchRetry = time.Second

// watch waits, through the shim, for the container to exit and records
// it at once, so status and events do not wait for someone to look. The
// client rides out the monitor's restarts; if the shim is gone for good
// instead, the container is lost.
func (s *Store) watch(e *entry) {
	e.mu.Lock()
	id, pod := e.rec.ID, e.rec.PodID
	e.unlock()
	for {
		st, err := s.shims.Pod(pod).Wait(s.watching, id)
		if s.watching.Err() != nil {
			return // closed: what the shim says now is for the next Store
		}
		if s.recordWatched(e, st, err) {
			return
		}
		select {
		case <-s.watching.Done():
			return
		case <-time.After(watchRetry):
		}
	}
}

// recordWatched records what a watcher's wait returned; false means wait
// again.
func (s *Store) recordWatched(e *entry, st *shim.State, err error) bool {
	e.mu.Lock()
	defer e.unlock()
	r := e.rec
	if e.removed || r.State == StateExited {
		return true
	}
	switch {
	case err == nil && st != nil && st.Exit != nil:
		s.setExited(e, st.Exit)
		return true
	case errors.Is(err, errdefs.ErrNotFound):
		// Deleted from the shim (remove in progress): Remove records it.
		return true
	case errors.Is(err, shim.ErrNoShim):
		s.foldExit(e)
		if r.State != StateExited {
			s.log.Warn("lost the container's shim", "pod", r.PodID, "container", r.ID, "err", err)
			_ = s.exitedIfShimGone(e, err)
		}
		return true
	default:
		s.foldExit(e)
		if r.State == StateExited {
			return true
		}
		s.log.Warn("wait for the container's exit; waiting again", "pod", r.PodID, "container", r.ID, "err", err)
		return false
	}
}

// foldExit records an exit the shim persisted but the record does not
// show yet. Caller holds e.mu.
func (s *Store) foldExit(e *entry) {
	r := e.rec
	if r.State == StateExited {
		return
	}
	ex, ok, err := s.shims.Pod(r.PodID).Exit(r.ID)
	if err != nil {
		s.log.Warn("read exit", "container", r.ID, "err", err)
		return
	}
	if ok {
		s.setExited(e, ex)
	}
}

// setExited records an exit and reports it. Caller holds e.mu.
func (s *Store) setExited(e *entry, ex *shim.Exit) {
	r := e.rec
	if r.State == StateExited {
		return
	}
	r.State = StateExited
	r.FinishedAt = ex.At
	r.ExitCode = int32(ex.Code)
	switch {
	case ex.Unknown != "":
		r.Reason, r.Message = ReasonUnknown, ex.Unknown
	case ex.OOMKilled:
		r.Reason = ReasonOOMKilled
	case ex.Code == 0:
		r.Reason = ReasonCompleted
	default:
		r.Reason = ReasonError
	}
	if err := s.saveRecord(r); err != nil {
		s.log.Warn("save exited record", "container", r.ID, "err", err)
	}
	s.emit(EventStopped, e)
}

// exitedIfShimGone turns "the shim is gone" into an exited record;
// other errors pass through. No keeper and no monitor serve the
// container any more, so nothing would report its exit: if its processes
// still run (the keeper died with its monitor, or the monitor did not
// come back), they are killed through the OCI runtime first, as
// containerd's shim cleanup does, so the record does not say exited while
// they run on. Caller holds e.mu.
func (s *Store) exitedIfShimGone(e *entry, err error) error {
	if !errors.Is(err, shim.ErrNoShim) {
		return err
	}
	s.foldExit(e)
	r := e.rec
	if r.State == StateExited {
		return nil
	}
	msg := "no monitor serves the pod any more"
	if rt, ok := s.runtime(r.Runtime); ok {
		ctx, cancel := context.WithTimeout(context.Background(), killUnwatchedTimeout)
		if rst, serr := rt.State(ctx, r.ID); serr == nil && rst.Status != "stopped" {
			msg = "no monitor serves the pod any more; its processes were killed"
			s.log.Warn("kill a container no shim watches", "pod", r.PodID, "container", r.ID, "status", rst.Status)
		}
		if derr := rt.Delete(ctx, r.ID, true); derr != nil {
			s.log.Warn("runtime delete of a container no shim watches", "container", r.ID, "err", derr)
		}
		cancel()
		s.foldExit(e) // a shim that was only slow may have seen it go
		if r.State == StateExited {
			return nil
		}
	}
	s.setExited(e, &shim.Exit{Code: 255, At: time.Now().UTC(), Unknown: msg})
	return nil
}

// killUnwatchedTimeout bounds the runtime calls that kill a container no
// shim watches.
const killUnwatchedTimeout = 30 * time.Second
