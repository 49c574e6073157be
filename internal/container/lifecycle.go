package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/moby/sys/signal"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/shim"
)

// startUndoTimeout bounds how long a start that could not be recorded
// waits for the process it kills.
const startUndoTimeout = 10 * time.Second

// Start runs a created container; any other state is FailedPrecondition.
// It returns with one truth in memory, on disk and in its answer: running
// and recorded so, or an error and exited (reason StartError).
func (s *Store) Start(ctx context.Context, id string) (*Container, error) {
	e, err := s.lock(ctx, id)
	if err != nil {
		return nil, err
	}
	defer e.unlock()
	s.foldExit(e)
	r := e.rec
	if r.State != StateCreated {
		return nil, fmt.Errorf("container %s is %s, not created: %w", r.ID, r.State, errdefs.ErrFailedPrecondition)
	}
	// Taken before the start: a quick process can finish before it returns.
	startedAt := time.Now().UTC()
	s.opts.Faults.Hit(fault.ContainerBeforeRuncStart, "pod", r.PodID, "container", r.ID)
	sh := s.shims.Pod(r.PodID)
	st, err := sh.Start(ctx, r.ID)
	if err != nil {
		// A failed start leaves the container exited, as in containerd.
		s.failStart(e, err.Error())
		return nil, fmt.Errorf("start container %s: %w", r.ID, err)
	}
	if st != nil && st.Pid != 0 {
		r.Pid = st.Pid // a restored container's process exists only now
	}
	s.opts.Faults.Hit(fault.ContainerAfterRuncStart, "pod", r.PodID, "container", r.ID)
	r.State, r.StartedAt = StateRunning, startedAt
	if err := s.saveStarted(r); err != nil {
		// Running but not recorded so: stop the process rather than
		// answer an error about a container that runs.
		s.killUnrecorded(ctx, sh, r.ID)
		r.StartedAt = time.Time{}
		s.failStart(e, "started, but the record could not say so: "+err.Error())
		return nil, fmt.Errorf("start container %s: %w", r.ID, err)
	}
	if r.Restored {
		// The processes are back: their images are not needed again.
		if err := os.RemoveAll(restoreImages(s.dir(r.ID))); err != nil {
			s.log.Warn("remove restored checkpoint images", "container", r.ID, "err", err)
		}
	}
	s.emit(EventStarted, e)
	s.foldExit(e) // it may be done already; else the watcher sees the exit
	s.log.Info("container started", "pod", r.PodID, "container", r.ID)
	return r.clone(), nil
}

func (s *Store) saveStarted(r *Container) error {
	if err := s.opts.Faults.Fail(fault.ContainerFailStartRecordWrite); err != nil {
		return err
	}
	return s.saveRecordSoon(r)
}

// killUnrecorded kills a container whose start could not be recorded and
// waits for its exit.
func (s *Store) killUnrecorded(ctx context.Context, sh Shim, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startUndoTimeout)
	defer cancel()
	if err := sh.Kill(ctx, id, syscall.SIGKILL, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Error("kill a container whose start could not be recorded", "container", id, "err", err)
	}
	_ = sh.Kill(ctx, id, syscall.SIGKILL, false) // see stopLocked
	if _, err := sh.Wait(ctx, id); err != nil {
		s.log.Error("wait for a container whose start could not be recorded", "container", id, "err", err)
	}
}

// failStart records a start that did not happen: the container is exited
// with reason StartError. Caller holds e.mu.
func (s *Store) failStart(e *entry, msg string) {
	r := e.rec
	r.State, r.FinishedAt, r.ExitCode, r.Reason, r.Message = StateExited, time.Now().UTC(), 128, ReasonStart, msg
	if err := s.saveRecord(r); err != nil {
		s.log.Warn("save the record of a failed start", "container", r.ID, "err", err)
	}
	s.emit(EventStopped, e)
}

// parseSignal accepts "SIGTERM", "TERM", "15" or "SIGRTMIN+3" (moby's
// names, as containerd); "" is SIGTERM.
func parseSignal(name string) (syscall.Signal, error) {
	if name == "" {
		return syscall.SIGTERM, nil
	}
	sig, err := signal.ParseSignal(name)
	if err != nil || !signal.ValidSignalForPlatform(sig) {
		return 0, fmt.Errorf("unknown stop signal %q: %w", name, errdefs.ErrInvalidArgument)
	}
	return sig, nil
}

// Stop sends the stop signal, waits up to timeout, then SIGKILLs and waits
// for the exit. Exited containers and unknown IDs are no-ops.
func (s *Store) Stop(ctx context.Context, id string, timeout time.Duration) error {
	e, err := s.lock(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer e.unlock()
	return s.stopLocked(ctx, e, timeout)
}

func (s *Store) stopLocked(ctx context.Context, e *entry, timeout time.Duration) error {
	s.foldExit(e)
	r := e.rec
	if r.State == StateExited {
		return nil
	}
	sh := s.shims.Pod(r.PodID)
	if timeout > 0 {
		sig, err := parseSignal(r.StopSignal)
		if err != nil {
			s.log.Warn("bad stop signal; using SIGTERM", "container", r.ID, "signal", r.StopSignal)
			sig = syscall.SIGTERM
		}
		if err := sh.Kill(ctx, r.ID, sig, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return s.exitedIfShimGone(e, fmt.Errorf("signal container %s: %w", r.ID, err))
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		st, err := sh.Wait(wctx, r.ID)
		cancel()
		if err == nil && st.Exit != nil {
			s.setExited(e, st.Exit)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stop container %s: %w", r.ID, ctx.Err())
		}
	}
	if err := sh.Kill(ctx, r.ID, syscall.SIGKILL, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return s.exitedIfShimGone(e, fmt.Errorf("kill container %s: %w", r.ID, err))
	}
	// runc kill --all finds the processes through one v1 hierarchy
	// (devices); under --systemd-cgroup the init can sit in the pod slice's
	// cgroup there instead of its scope's, and then gets nothing. The init
	// itself is always reachable.
	_ = sh.Kill(ctx, r.ID, syscall.SIGKILL, false)
	st, err := sh.Wait(ctx, r.ID)
	if err != nil {
		return s.exitedIfShimGone(e, fmt.Errorf("wait for container %s: %w", r.ID, err))
	}
	if st.Exit != nil {
		s.setExited(e, st.Exit)
	}
	s.log.Info("container stopped", "pod", r.PodID, "container", r.ID, "exit_code", r.ExitCode)
	return nil
}

// Remove deletes a container, forcing it down if it runs, and returns its
// record as it was when removed; an unknown ID is no error and returns
// nil. The log file stays (the kubelet owns it). A Remove that fails
// leaves the container listed, for a retry to finish.
func (s *Store) Remove(ctx context.Context, id string) (*Container, error) {
	e, err := s.lock(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer e.unlock()
	r := e.rec
	st, err := s.shims.Pod(r.PodID).Delete(ctx, r.ID)
	switch {
	case err == nil:
		if st != nil && st.Exit != nil && r.State == StateRunning {
			s.setExited(e, st.Exit) // removed while running: it stopped first
		}
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, shim.ErrNoShim):
		// No shim holds it (it died, or a crash cut a remove short): make
		// sure the runtime forgets it too.
		if rt, ok := s.runtime(r.Runtime); ok {
			if err := rt.Delete(ctx, r.ID, true); err != nil {
				s.log.Warn("runtime delete", "container", r.ID, "err", err)
			}
		}
	default:
		return nil, fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	s.opts.Faults.Hit(fault.ContainerMidRemove, "pod", r.PodID, "container", r.ID)
	dir := s.dir(r.ID)
	if err := s.mounts.Unmount(dir); err != nil {
		return nil, fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	for _, owner := range append([]string{r.ID}, r.VolumeOwners...) {
		if err := s.images.Release(owner); err != nil {
			return nil, fmt.Errorf("remove container %s: release image: %w", r.ID, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("remove container %s: %w", r.ID, err)
	}
	e.removed = true
	s.forget(r)
	s.emit(EventDeleted, e)
	s.log.Info("container removed", "pod", r.PodID, "container", r.ID)
	return r.clone(), nil
}

// StopPod stops every container of a pod.
func (s *Store) StopPod(ctx context.Context, podID string, timeout time.Duration) error {
	var errs []error
	for _, c := range s.ListPod(podID) {
		if err := s.Stop(ctx, c.ID, timeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemovePod removes every container of a pod and returns the ones it
// removed, oldest first, also when it failed for others: those stay
// listed, and a retry returns only them, so whoever reports removals
// reports each container once.
func (s *Store) RemovePod(ctx context.Context, podID string) ([]*Container, error) {
	var (
		removed []*Container
		errs    []error
	)
	for _, c := range s.ListPod(podID) {
		r, err := s.Remove(ctx, c.ID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r != nil {
			removed = append(removed, r)
		}
	}
	return removed, errors.Join(errs...)
}

// UpdateResources applies new limits to a created or running container
// and records them for status.
func (s *Store) UpdateResources(ctx context.Context, id string, res *specs.LinuxResources, cri *runtime.LinuxContainerResources) error {
	e, err := s.lock(ctx, id)
	if err != nil {
		return err
	}
	defer e.unlock()
	s.foldExit(e)
	r := e.rec
	if r.State == StateExited {
		return fmt.Errorf("container %s has exited: %w", r.ID, errdefs.ErrFailedPrecondition)
	}
	rt, ok := s.runtime(r.Runtime)
	if !ok {
		return fmt.Errorf("runtime handler %q is gone from the config: %w", r.Runtime, errdefs.ErrFailedPrecondition)
	}
	s.dropLimits(r.ID, res)
	if err := rt.Update(ctx, r.ID, res); err != nil {
		return fmt.Errorf("update container %s: %w", r.ID, err)
	}
	r.Resources = cri
	return s.saveRecord(r)
}

// dropLimits removes limits of missing cgroup controllers from res. The
// daemon said once at start which ones go; here only debug.
func (s *Store) dropLimits(id string, res *specs.LinuxResources) {
	if s.opts.Cgroups == nil || res == nil {
		return
	}
	if dropped := s.opts.Cgroups.Drop(res); len(dropped) > 0 {
		s.log.Debug("limits of missing cgroup controllers dropped", "container", id, "controllers", dropped)
	}
}

// ReopenLog makes the shim reopen the container's log file (after the
// kubelet rotated it). The container must be running.
func (s *Store) ReopenLog(ctx context.Context, id string) error {
	e, err := s.lock(ctx, id)
	if err != nil {
		return err
	}
	defer e.unlock()
	s.foldExit(e)
	if e.rec.State != StateRunning {
		return fmt.Errorf("container %s is %s, not running: %w", e.rec.ID, e.rec.State, errdefs.ErrFailedPrecondition)
	}
	if err := s.shims.Pod(e.rec.PodID).ReopenLog(ctx, e.rec.ID); err != nil {
		return fmt.Errorf("reopen log of %s: %w", e.rec.ID, err)
	}
	return nil
}
