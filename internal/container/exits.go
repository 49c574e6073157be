package container

import (
	"errors"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
)

// How berthd learns that a container exited: the pod's shim reaps it and
// persists its exit status; a watcher per container hears it at once
// (watch), and anything that looks at a container folds in an exit the
// watcher has not recorded yet (foldExit). A shim that is gone takes its
// containers' processes with it (exitedIfShimGone).

// startWatch watches e for its exit until it exits or the store closes.
func (s *Store) startWatch(e *entry) {
	s.watchers.Add(1)
	go func() {
		defer s.watchers.Done()
		s.watch(e)
	}()
}

// watch waits, through the shim, for the container to exit and records
// it at once, so status and events do not wait for someone to look. If
// the shim goes away instead, the container is lost.
func (s *Store) watch(e *entry) {
	e.mu.Lock()
	id, pod := e.rec.ID, e.rec.PodID
	e.unlock()
	st, err := s.shims.Pod(pod).Wait(s.watching, id)
	if s.watching.Err() != nil {
		return // closed: what the shim says now is for the next Store
	}
	e.mu.Lock()
	defer e.unlock()
	if e.removed || e.rec.State == StateExited {
		return
	}
	switch {
	case err == nil && st.Exit != nil:
		s.setExited(e, st.Exit)
	case errors.Is(err, errdefs.ErrNotFound):
		// Deleted from the shim (remove in progress): Remove records it.
		return
	default:
		s.foldExit(e)
		if e.rec.State != StateExited {
			s.log.Warn("lost the container's shim", "pod", pod, "container", id, "err", err)
			_ = s.exitedIfShimGone(e, shim.ErrNoShim)
		}
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
	if err := saveRecord(s.dir(r.ID), r); err != nil {
		s.log.Warn("save exited record", "container", r.ID, "err", err)
	}
	s.emit(EventStopped, e)
}

// exitedIfShimGone turns "the shim is gone" into an exited record (its
// processes died with it or cannot be reached); other errors pass through.
// Caller holds e.mu.
func (s *Store) exitedIfShimGone(e *entry, err error) error {
	if !errors.Is(err, shim.ErrNoShim) {
		return err
	}
	s.foldExit(e)
	if e.rec.State != StateExited {
		s.setExited(e, &shim.Exit{Code: 255, At: time.Now().UTC(), Unknown: "the pod's shim is gone"})
	}
	return nil
}
