package leakcheck

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ParentPid is pid's parent from /proc/PID/stat (0 if it is gone).
func ParentPid(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the fields
	// after its closing one are the state, then the parent.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
