// Package exits keeps the exit statuses of children reaped before anyone
// was waiting for them: the keeper and the monitor both reap processes
// whose pids reach them only later (read from a pid file after the process
// died, or registered after it exited).
package exits

import (
	"time"

	"golang.org/x/sys/unix"
)

// Kept is how long an unclaimed exit is kept: long enough for the
// registration that is on its way, short enough that orphans reparented
// to the reaper do not pile up.
const Kept = time.Minute

// Unclaimed holds exits nobody claimed yet. The zero value is ready to
// use; it is not safe for concurrent use (its owner's lock guards it).
type Unclaimed struct {
	byPid map[int]unclaimed
}

type unclaimed struct {
	status unix.WaitStatus
	at     time.Time
}

// Add keeps pid's exit status, reaped at now, and drops those older than
// Kept.
func (u *Unclaimed) Add(pid int, ws unix.WaitStatus, now time.Time) {
	if u.byPid == nil {
		u.byPid = map[int]unclaimed{}
	}
	for p, e := range u.byPid {
		if now.Sub(e.at) > Kept {
			delete(u.byPid, p)
		}
	}
	u.byPid[pid] = unclaimed{status: ws, at: now}
}

// Take returns and forgets pid's exit status, if it was kept.
func (u *Unclaimed) Take(pid int) (unix.WaitStatus, bool) {
	e, ok := u.byPid[pid]
	if ok {
		delete(u.byPid, pid)
	}
	return e.status, ok
}

// Len is how many exits are kept.
func (u *Unclaimed) Len() int { return len(u.byPid) }
