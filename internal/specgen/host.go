package specgen

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host is what Build needs to know about the machine. ProbeHost fills it;
// tests build their own.
type Host struct {
	// Hostname is used for the HOSTNAME env when the pod sets none.
	Hostname string
	// RlimitHard maps "RLIMIT_NOFILE" etc. to the daemon's hard limit.
	RlimitHard map[string]uint64
	// NROpen is fs.nr_open, the most RLIMIT_NOFILE can be even with
	// CAP_SYS_RESOURCE (0: unknown).
	NROpen uint64
	// AllCapabilities are the capabilities berthd holds (its CapEff): the
	// most a container can get ("ALL", privileged).
	AllCapabilities []string
	AppArmor        bool // AppArmor is enabled
	SELinux         bool // SELinux is enabled
	CgroupV2        bool // unified hierarchy
	SwapAccounting  bool // memory.memsw (v1) or memory.swap.max (v2)
	// RecursiveReadOnly: the OCI runtime supports "rro" mounts.
	RecursiveReadOnly bool
	// MountInfoPath is read to check the propagation of bind-mount
	// sources; "" → /proc/self/mountinfo.
	MountInfoPath string
	// DevPath is where privileged containers' devices come from; "" → /dev.
	DevPath string
}

// rlimitResources are the rlimits Build knows how to clamp.
var rlimitResources = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}

// ProbeHost reads the host's facts from /proc and /sys.
func ProbeHost() (*Host, error) {
	h := &Host{RlimitHard: map[string]uint64{}}
	var err error
	if h.Hostname, err = os.Hostname(); err != nil {
		return nil, fmt.Errorf("hostname: %w", err)
	}
	for name, res := range rlimitResources {
		var rl unix.Rlimit
		if err := unix.Getrlimit(res, &rl); err != nil {
			return nil, fmt.Errorf("getrlimit %s: %w", name, err)
		}
		h.RlimitHard[name] = rl.Max
	}
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		h.NROpen, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, fmt.Errorf("read own status: %w", err)
	}
	if h.AllCapabilities, err = effectiveCapabilities(string(status)); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile("/sys/module/apparmor/parameters/enabled"); err == nil {
		h.AppArmor = strings.HasPrefix(string(b), "Y")
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/selinux", &st); err == nil && st.Type == unix.SELINUX_MAGIC {
		h.SELinux = true
	}
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return nil, fmt.Errorf("statfs /sys/fs/cgroup: %w", err)
	}
	h.CgroupV2 = st.Type == unix.CGROUP2_SUPER_MAGIC
	if h.CgroupV2 {
		// The root has no memory.swap.max; any child cgroup with the
		// memory controller enabled has it, so look at the controller list.
		b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		ctrls := strings.Fields(string(b))
		h.SwapAccounting = slices.Contains(ctrls, "memory") && exists("/proc/sys/vm/swappiness")
	} else {
		h.SwapAccounting = exists("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
	}
	return h, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil || !errors.Is(err, os.ErrNotExist)
}

// effectiveCapabilities lists the CapEff set of a /proc/<pid>/status: a
// container can only get capabilities the daemon holds (here berthd runs
// without CAP_SYS_RESOURCE), as containerd's cap.Current.
func effectiveCapabilities(status string) ([]string, error) {
	for _, line := range strings.Split(status, "\n") {
		hex, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("parse CapEff %q: %w", hex, err)
		}
		var caps []string
		for i, c := range knownCapabilities {
			if mask&(1<<i) != 0 {
				caps = append(caps, c)
			}
		}
		return caps, nil
	}
	return nil, fmt.Errorf("no CapEff in /proc/self/status")
}

// knownCapabilities in kernel order (capability number = index).
var knownCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}
