package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupctrl"
)

// Status reports whether the runtime and pod networking are ready. With
// verbose set, Info carries the effective configuration as JSON.
func (s *Service) Status(ctx context.Context, req *runtime.StatusRequest) (*runtime.StatusResponse, error) {
	conditions := []*runtime.RuntimeCondition{s.runtimeCondition(), s.networkCondition()}
	resp := &runtime.StatusResponse{
		Status:          &runtime.RuntimeStatus{Conditions: conditions},
		RuntimeHandlers: s.runtimeHandlers(),
		Features: &runtime.RuntimeFeatures{
			// specgen honours SupplementalGroupsPolicy Merge and Strict.
			SupplementalGroupsPolicy: true,
			// specgen applies Mount.mount_options (noexec, nodev,
			// nosuid, atime flags) and refuses any other.
			MountOptions: true,
			// A pod with its own user namespace may use the host's
			// network (its containers get the host's /sys read-only):
			// true wherever some handler runs user namespace pods.
			UserNamespacesHostNetwork: s.anyHandlerUserNamespaces(),
		},
	}
	if req.GetVerbose() {
		info, err := s.statusInfo()
		if err != nil {
			return nil, toStatus(err)
		}
		resp.Info = info
	}
	return resp, nil
}

// anyHandlerUserNamespaces reports whether some handler runs user
// namespace pods (the node passed the probe and the runtime has them).
func (s *Service) anyHandlerUserNamespaces() bool {
	live := s.live.Load()
	for _, name := range live.HandlerNames() {
		if h, ok := live.Handler(name); ok && h.Features.UserNamespaces {
			return true
		}
	}
	return false
}

func (s *Service) runtimeCondition() *runtime.RuntimeCondition {
	cond := &runtime.RuntimeCondition{Type: runtime.RuntimeReady, Status: true}
	rt := s.live.Load().Config.Runtime
	if _, err := exec.LookPath(rt); err != nil {
		cond.Status = false
		cond.Reason = "OCIRuntimeNotFound"
		cond.Message = fmt.Sprintf("OCI runtime %q: %v", rt, err)
	}
	return cond
}

func (s *Service) networkCondition() *runtime.RuntimeCondition {
	cond := &runtime.RuntimeCondition{Type: runtime.NetworkReady, Status: true}
	if err := s.network.Ready(); err != nil {
		cond.Status, cond.Reason, cond.Message = false, "NetworkPluginNotReady", "berth: CNI: "+err.Error()
	}
	return cond
}

func (s *Service) statusInfo() (map[string]string, error) {
	// The configuration in effect: what the last reload applied.
	live := s.live.Load()
	cfgJSON, err := json.Marshal(live.Config)
	if err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	// stateDir, as in containerd's config JSON, is where container rootfs
	// live: critest probes idmapped-mount support on its parent (--root,
	// which also holds the image layers berth idmaps).
	var cfgMap map[string]any
	if err := json.Unmarshal(cfgJSON, &cfgMap); err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	cfgMap["stateDir"] = filepath.Join(live.Config.Root, "containers")
	if cfgJSON, err = json.Marshal(cfgMap); err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	s.mu.Lock()
	podCIDR := s.podCIDR
	s.mu.Unlock()
	info := map[string]string{
		"config":           string(cfgJSON),
		"podCIDR":          podCIDR,
		"version":          s.version,
		"streamingAddress": s.addrs.Streaming,
		"metricsAddress":   s.addrs.Metrics,
		// The effective driver (config validation made it explicit; read
		// only at start, so a reload keeps it).
		"cgroupDriver": live.Config.CgroupDriver,
	}
	b, err := json.Marshal(cgroupInfo{
		Version: s.cgroups.Version(), Available: s.cgroups.Available, Source: s.cgroups.Source,
		MissingRequired: s.cgroups.MissingRequired(), MissingOptional: s.cgroups.MissingOptional(),
	})
	if err != nil {
		return nil, fmt.Errorf("encode cgroup controllers: %w", err)
	}
	info["cgroupControllers"] = string(b)
	return info, nil
}

// cgroupInfo is Status's "cgroupControllers": what berthctl info shows.
type cgroupInfo struct {
	Version         string               `json:"version"`
	Available       []string             `json:"available"`
	Source          string               `json:"source"`
	MissingRequired []string             `json:"missingRequired,omitempty"`
	MissingOptional []cgroupctrl.Missing `json:"missingOptional,omitempty"`
}
