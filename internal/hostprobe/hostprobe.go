// Package hostprobe asks the machine and its OCI runtimes, once, what they
// can do: berthd probes at start (and a reload probes the handlers it
// adds), and every later request reads the answers instead of asking
// again.
package hostprobe

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/specgen"
)

// Host is the machine as container creation sees it.
type Host struct {
	// Spec is what specgen needs of the host (capabilities, rlimits,
	// AppArmor, the cgroup version …).
	Spec *specgen.Host
	// OOMScoreAdj is berthd's own oom_score_adj: without
	// CAP_SYS_RESOURCE the kernel refuses lower values for its children.
	OOMScoreAdj int
}

// Probe reads the host's facts from /proc and /sys. An armed
// fault.HostFailSwapAccounting (tests only) makes it find no swap
// accounting: the one seam where that fact is decided.
func Probe(faults *fault.Injector) (*Host, error) {
	spec, err := specgen.ProbeHost()
	if err != nil {
		return nil, fmt.Errorf("probe host: %w", err)
	}
	if faults.Fail(fault.HostFailSwapAccounting) != nil {
		spec.SwapAccounting = false
	}
	return &Host{Spec: spec, OOMScoreAdj: ownOOMScoreAdj()}, nil
}

// ownOOMScoreAdj reads /proc/self/oom_score_adj; 0 when it cannot.
func ownOOMScoreAdj() int {
	data, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0
	}
	return n
}

// RuntimeFeatures asks each handler's runtime for its features
// (`<binary> features`). A runtime that cannot answer (too old, missing)
// gets none, with a warning: its containers then refuse recursive
// read-only mounts. usernsErr is why the node cannot run user namespace
// pods (nil: it can); then no handler offers them.
func RuntimeFeatures(ctx context.Context, runtimes map[string]*oci.Runtime, usernsErr error, log *slog.Logger) map[string]liveconfig.Features {
	out := make(map[string]liveconfig.Features, len(runtimes))
	for name, rt := range runtimes {
		f, err := rt.Features(ctx)
		if err != nil {
			log.Warn("runtime features probe failed; assuming none", "handler", name, "binary", rt.Binary, "err", err)
		}
		out[name] = liveconfig.Features{RecursiveReadOnly: f.RecursiveReadOnly(), UserNamespaces: usernsErr == nil && f.UserNamespaces()}
	}
	return out
}
