package checkpoint

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// ProcessesDump is berth's addition to a container checkpoint: what a
// restore into a shared PID namespace needs to know (Processes, JSON).
const ProcessesDump = "processes.dump"

// Processes describes a checkpointed container's processes.
type Processes struct {
	// MaxPID is the highest PID or thread ID of the container's
	// processes as their PID namespace numbers them.
	MaxPID int `json:"max_pid"`
}

// MaxNSPID is the highest PID or thread ID, as the innermost PID
// namespace numbers it (NSpid), of the process tree rooted at the host
// PID pid. The tree must hold still: its container is paused.
func MaxNSPID(pid int) (int, error) {
	highest := 0
	for todo := []int{pid}; len(todo) > 0; {
		p := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(p) + "/task")
		if err != nil {
			return 0, fmt.Errorf("processes of %d: %w", pid, err)
		}
		for _, t := range tasks {
			dir := "/proc/" + strconv.Itoa(p) + "/task/" + t.Name()
			n, err := nsPID(dir + "/status")
			if err != nil {
				return 0, err
			}
			highest = max(highest, n)
			children, err := os.ReadFile(dir + "/children")
			if err != nil {
				return 0, fmt.Errorf("processes of %d: %w", pid, err)
			}
			for _, f := range strings.Fields(string(children)) {
				c, err := strconv.Atoi(f)
				if err != nil {
					return 0, fmt.Errorf("%s/children: %q", dir, f)
				}
				todo = append(todo, c)
			}
		}
	}
	return highest, nil
}

// nsPID reads the last (innermost) NSpid of a task's status file.
func nsPID(status string) (int, error) {
	f, err := os.Open(status)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				break
			}
			return strconv.Atoi(fs[len(fs)-1])
		}
	}
	return 0, fmt.Errorf("%s has no NSpid", status)
}

// SetLastPID makes the PID namespace pinned at nsPath hand out PIDs above
// n from now on (its ns_last_pid, only ever raised), so that processes started in it before
// every checkpointed container is restored cannot take a PID a restore
// needs. The write is made by a child in that namespace (nsenter forks
// one): ns_last_pid acts on its writer's namespace.
func SetLastPID(ctx context.Context, nsPath string, n int) error {
	out, err := exec.CommandContext(ctx, "nsenter", "--pid="+nsPath, "--",
		"/bin/sh", "-c", `[ "$(cat /proc/sys/kernel/ns_last_pid)" -ge "$1" ] || echo "$1" > /proc/sys/kernel/ns_last_pid`, "sh", strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("set ns_last_pid of %s to %d: %v: %s", nsPath, n, err, strings.TrimSpace(string(out)))
	}
	return nil
}
