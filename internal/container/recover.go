package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim"
)

// recover loads every record and reconciles it with its pod on the node's
// monitor: exits persisted while berthd was down are folded in; a container
// no monitor serves any more, without an exit, is marked exited (unknown).
// What a create cut short left without a record is undone (orphans.go).
func (s *Store) recover(ctx context.Context) error {
	ids, err := s.records.IDs()
	if err != nil {
		return err
	}
	kept := map[string]bool{}            // container IDs whose directory stays
	live := map[string]map[string]bool{} // pod → container IDs the monitor holds
	for _, id := range ids {
		if err := closeDir(s.dir(id)); err != nil {
			s.log.Error("cannot close a container directory to other host users", "container", id, "err", err)
		}
		rec, err := s.loadRecord(id)
		if err != nil {
			if !s.removeUnrecorded(s.dir(id), err) {
				kept[id] = true
			}
			continue
		}
		kept[rec.ID] = true
		e := newEntry(rec)
		s.index(e)
		e.mu.Lock()
		s.reconcile(ctx, e, live)
		e.unlock()
	}
	s.releaseOrphanLeases(kept)
	s.reapOrphans(ctx)
	s.log.Info("containers recovered", "count", s.objs.Len())
	return nil
}

// reconcile brings a loaded record up to date with its pod on the node's
// monitor, whose word wins, and watches it if it still runs. live caches
// each pod's container listing. Caller holds e.mu.
func (s *Store) reconcile(ctx context.Context, e *entry, live map[string]map[string]bool) {
	rec := e.rec
	s.foldExit(e)
	if rec.State == StateExited {
		return
	}
	ids, ok := live[rec.PodID]
	if !ok {
		list, err := s.shims.Pod(rec.PodID).List(ctx)
		if err != nil && !errors.Is(err, shim.ErrNoShim) {
			s.log.Warn("ask shim for its containers", "pod", rec.PodID, "err", err)
			return
		}
		if err == nil {
			ids = map[string]bool{}
			for _, id := range list {
				ids[id] = true
			}
		}
		live[rec.PodID] = ids // nil: no shim serves the pod
	}
	if ids == nil {
		// No keeper or monitor serves the pod (both died while berthd
		// was down, or no monitor came back): nothing reports its
		// containers' exits, so any process of theirs still running is
		// killed before the record says exited (exits.go).
		_ = s.exitedIfShimGone(e, shim.ErrNoShim)
		return
	}
	if !ids[rec.ID] {
		s.setExited(e, &shim.Exit{Code: 255, At: time.Now().UTC(), Unknown: "container lost while berthd was down"})
		return
	}
	if rec.State == StateCreated {
		s.rollForwardStart(ctx, e)
	}
	s.startWatch(e)
}

// rollForwardStart finishes a StartContainer cut short after the shim
// started the process but before the record said so: the shim's word wins.
func (s *Store) rollForwardStart(ctx context.Context, e *entry) {
	r := e.rec
	st, err := s.shims.Pod(r.PodID).State(ctx, r.ID)
	if err != nil || st.Status == shim.StatusCreated {
		return
	}
	r.State, r.StartedAt = StateRunning, processStart(st.Pid)
	if st.Pid > 0 {
		r.Pid = st.Pid
	}
	if r.Restored {
		_ = os.RemoveAll(restoreImages(s.dir(r.ID))) // restored: not needed again
	}
	s.log.Warn("container was started just before berthd stopped; recording it running", "pod", r.PodID, "container", r.ID)
	if err := s.saveRecord(r); err != nil {
		s.log.Warn("save started record", "container", r.ID, "err", err)
	}
	s.emit(EventStarted, e)
	// Exited since: fold the exit in too.
	s.foldExit(e)
}

// processStart is when pid started, from /proc/<pid>/stat, or now if that
// is unknown.
func processStart(pid int) time.Time {
	now := time.Now().UTC()
	if pid <= 0 {
		return now
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return now
	}
	// Fields after the command (which may hold spaces) start at ")".
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return now
	}
	f := strings.Fields(string(stat)[i+1:])
	if len(f) < 20 {
		return now
	}
	ticks, err := strconv.ParseUint(f[19], 10, 64) // field 22: starttime
	if err != nil {
		return now
	}
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		return now
	}
	const clockTicks = 100 // USER_HZ on every Linux berth runs on
	boot := now.Add(-time.Duration(info.Uptime) * time.Second)
	return boot.Add(time.Duration(ticks) * time.Second / clockTicks)
}
