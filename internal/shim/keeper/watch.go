package keeper

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim/proto"
)

// The watchdog (decision 3300): a monitor that is alive but does not
// serve (stopped, deadlocked, stuck in the kernel) would freeze every
// call of every pod that needs it, for as long as it lasts. The keeper
// pings it over the link every pingInterval; a monitor that said it
// serves (its first pong, unasked, once past adoption) and then leaves a
// ping unanswered for hungAfter is killed with SIGKILL and restarted as after
// a crash: the next monitor adopts every container, berthd's waiting
// calls ask it again. A monitor still adopting (no pong yet) gets
// adoptHungAfter instead: adoption runs the runtime for each container
// created and not started; and the whole outage (hang, kill, the next
// adoption) must stay inside berthd's 60 s wait for a monitor
// (shim.MonitorRestartTimeout), after which a pod not adopted yet would
// have its containers taken for lost.
const (
	pingInterval   = 5 * time.Second
	hungAfter      = 10 * time.Second
	adoptHungAfter = 30 * time.Second
)

// watchState is the watchdog's view of the current monitor; Keeper.wmu
// guards it.
type watchState struct {
	pidfd    int       // the monitor's pidfd, -1 when none is watched
	pid      int       // for the log
	link     int       // its link, -1 once closed
	pingSent time.Time // the ping not answered yet; zero when none
	missed   int       // ticks since pingSent without an answer
	answered bool      // it sent a pong: it serves, and is timed
	untimed  bool      // it serves but never pongs (older than the pings)
}

// startWatchdog pings the current monitor every pingInterval until the
// returned stop is called.
func (k *Keeper) startWatchdog() (stop func()) {
	t := time.NewTicker(pingInterval)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
				k.checkMonitor(time.Now())
			}
		}
	}()
	return func() { t.Stop(); close(done) }
}

// watchMonitor starts watching the monitor pid on link, once its adopt
// list is sent. Called on Run's goroutine before the monitor can be
// reaped, so the pidfd is the monitor's.
func (k *Keeper) watchMonitor(pid, link int) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		k.logf("watch monitor %d: pidfd: %v; it is not watched", pid, err)
		pidfd = -1
	}
	k.wmu.Lock()
	defer k.wmu.Unlock()
	k.dropWatchLocked()
	k.watch = watchState{pidfd: pidfd, pid: pid, link: link}
}

// monitorReaped ends the watch of the monitor Run just reaped.
func (k *Keeper) monitorReaped() {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	k.dropWatchLocked()
}

func (k *Keeper) dropWatchLocked() {
	if k.watch.pidfd >= 0 {
		unix.Close(k.watch.pidfd)
	}
	k.watch = watchState{pidfd: -1, link: -1}
}

// closeLink closes a monitor's link fd under wmu, so that the watchdog
// never sends to the number once it is closed (and maybe reused).
func (k *Keeper) closeLink(fd int) {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	if k.watch.link == fd {
		k.watch.link = -1
	}
	unix.Close(fd)
}

// ponged records the monitor's answer to the outstanding ping.
func (k *Keeper) ponged() {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	k.watch.pingSent = time.Time{}
	k.watch.answered = true
}

// checkMonitor is one tick of the watchdog: kill a monitor that left a
// ping unanswered for hungAfter, or ping it. It never blocks: the ping
// is sent without waiting (a monitor whose buffer is full does not read,
// and its ping stays unanswered).
func (k *Keeper) checkMonitor(now time.Time) {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	w := &k.watch
	if w.pidfd < 0 || w.link < 0 || w.untimed {
		return
	}
	if !w.pingSent.IsZero() {
		// Counted in ticks, not read off the clock: a tick a hair
		// early must not add a whole interval to the bound.
		w.missed++
		bound, doing := hungAfter, "answer"
		if !w.answered {
			bound, doing = adoptHungAfter, "finish adopting"
		}
		if w.missed >= int(bound/pingInterval) && !w.answered && k.monitorListens() {
			// Adopted (it listens only after) and serving, but it never
			// pongs: a monitor older than the pings, never timed.
			k.logf("monitor %d serves but does not answer pings (an older monitor?): not watched", w.pid)
			w.untimed = true
			return
		}
		if w.missed >= int(bound/pingInterval) {
			k.logf("monitor %d did not %s for %v: killing it as hung; the next one adopts every container", w.pid, doing, now.Sub(w.pingSent).Round(time.Second))
			if err := unix.PidfdSendSignal(w.pidfd, unix.SIGKILL, nil, 0); err != nil {
				k.logf("kill hung monitor %d: %v", w.pid, err)
			}
			// Reaped and restarted by Run; not watched meanwhile.
			unix.Close(w.pidfd)
			w.pidfd = -1
		}
		return
	}
	if err := proto.TrySendKeeperMsg(w.link, &proto.KeeperMsg{Op: proto.KeeperPing}); err != nil && !errors.Is(err, unix.EAGAIN) {
		k.logf("ping monitor %d: %v", w.pid, err)
		return
	}
	// Sent, or its buffer is full: either way an answer is due.
	w.pingSent, w.missed = now, 0
}

// monitorListens tells whether a monitor listens on the node's socket,
// without blocking: a connect that is accepted or finds the backlog full.
// A monitor listens there only once it has adopted every container.
func (k *Keeper) monitorListens() bool {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return true // cannot tell: do not kill on it
	}
	defer unix.Close(fd)
	err = proto.WithShortPath(proto.NodeSocketPath(k.dir), func(p string) error {
		return unix.Connect(fd, &unix.SockaddrUnix{Name: p})
	})
	return err == nil || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINPROGRESS)
}
