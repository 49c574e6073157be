package monitor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/shim/proto"
)

// drainTimeout bounds how long an exit waits for the container's output
// pipes to reach EOF (a leftover child may hold them open).
const drainTimeout = 2 * time.Second

// waitExit waits for the container's init to be reaped, then records the
// exit (decision 0301): the output drained and the OOM kill counted before
// recordExit.
func (p *Pod) waitExit(c *container, exitCh <-chan unix.WaitStatus, pidfd *os.File) {
	ws := p.reaper.waitInit(exitCh, pidfd)
	c.mu.Lock()
	e := &proto.Exit{Version: proto.ExitVersion, ID: c.id, Pid: c.pid, At: time.Now().UTC()}
	c.mu.Unlock()
	switch {
	case ws.Exited():
		e.Code = ws.ExitStatus()
	case ws.Signaled():
		e.Signal = int(ws.Signal())
		e.Code = 128 + e.Signal
	}
	// Under cgroupfs the cgroup outlives its processes until the runtime
	// deletes it; under systemd it may be gone already, and the watch has
	// seen the kill.
	if oomKills(c.memCgroup) > 0 {
		e.OOMKilled = true
	}
	drained := make(chan struct{})
	go func() { c.streams.Wait(); close(drained) }()
	t := time.NewTimer(drainTimeout)
	select {
	case <-drained:
	case <-t.C:
		p.logf("container %s: output not drained after %s", c.id, drainTimeout)
	}
	t.Stop()
	if c.oom.killed() || (e.Signal == int(unix.SIGKILL) && c.oom.parentKilled(c.memCgroup)) {
		e.OOMKilled = true
	}
	c.oom.stop()
	p.recordExit(c, e)
}

// recordExit makes c exited with e: persisted first, then visible, then
// its waits answered and its attach streams ended. It runs once per
// container: from waitExit, or for a container that never ran a process
// (one restored at start and deleted before it).
func (p *Pod) recordExit(c *container, e *proto.Exit) {
	if err := writeExit(p.dir, e); err != nil {
		p.logf("container %s: persist exit: %v", c.id, err)
	}
	c.mu.Lock()
	c.exit, c.phase = e, phaseExited
	waiters := c.waiters
	c.waiters = nil
	c.mu.Unlock()
	close(c.exited)
	p.answerWaiters(c, waiters)
	c.attaches.closeAll()
}

// writeExit persists e atomically: temp file, fsync, rename, fsync dir.
func writeExit(dir string, e *proto.Exit) error {
	return atomicfile.Write(proto.ExitPath(dir, e.ID), proto.AppendExit(nil, e), 0o600)
}

// oomKills reads the cgroup's OOM kill counter (v1 memory.oom_control,
// v2 memory.events).
func oomKills(dir string) int {
	n, _ := readOOMKills(dir)
	return n
}

// readOOMKills is oomKills, and whether the cgroup had a counter to read.
func readOOMKills(dir string) (int, bool) {
	if dir == "" {
		return 0, false
	}
	for _, name := range []string{"memory.oom_control", "memory.events"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" {
				n, _ := strconv.Atoi(f[1])
				return n, true
			}
		}
	}
	return 0, false
}
