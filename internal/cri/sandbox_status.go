package cri

import (
	"context"
	"encoding/json"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/sandbox"
)

// PodSandboxStatus reports one sandbox and the statuses of its containers;
// verbose adds its paths as JSON.
//
// The kubelet's evented PLEG takes containers_statuses as the pod's
// containers and timestamp as the time of this status, keeping whichever
// of it and a container event (created_at) is newer. So the timestamp is
// taken before anything is read: a transition published after it has a
// later event, and one published before it shows in what is read.
func (s *Service) PodSandboxStatus(ctx context.Context, req *runtime.PodSandboxStatusRequest) (*runtime.PodSandboxStatusResponse, error) {
	if req.GetPodSandboxId() == "" {
		return nil, invalidArgument("PodSandboxStatus: pod_sandbox_id is required")
	}
	timestamp := time.Now()
	sb, err := s.sandboxes.Get(req.GetPodSandboxId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &runtime.PodSandboxStatusResponse{Status: podSandboxStatus(sb), Timestamp: timestamp.UnixNano()}
	for _, c := range s.containers.ListPod(sb.ID) {
		resp.ContainersStatuses = append(resp.ContainersStatuses, criContainerStatus(c))
	}
	if req.GetVerbose() {
		info, err := json.Marshal(map[string]any{
			"netnsPath": sb.NetNSPath, "ipcnsPath": sb.IPCNSPath, "utsnsPath": sb.UTSNSPath,
			"pidnsPath": sb.PIDNSPath, "cgroupParent": sb.CgroupParent, "cgroupUnit": sb.CgroupUnit, "hostnamePath": sb.HostnamePath,
			"hostsPath": sb.HostsPath, "resolvConfPath": sb.ResolvConfPath, "shmPath": sb.ShmPath,
			"runtimeHandler": sb.RuntimeHandler, "usernsPath": sb.UserNSPath,
		})
		if err != nil {
			return nil, toStatus(err)
		}
		resp.Info = map[string]string{"info": string(info)}
	}
	return resp, nil
}

func podSandboxStatus(sb *sandbox.Sandbox) *runtime.PodSandboxStatus {
	cfg := sb.Config
	st := &runtime.PodSandboxStatus{
		Id:             sb.ID,
		Metadata:       cfg.GetMetadata(),
		State:          sb.State,
		CreatedAt:      sb.CreatedAt.UnixNano(),
		Labels:         cfg.GetLabels(),
		Annotations:    cfg.GetAnnotations(),
		RuntimeHandler: sb.RuntimeHandler,
		Linux: &runtime.LinuxPodSandboxStatus{Namespaces: &runtime.Namespace{
			Options: cfg.GetLinux().GetSecurityContext().GetNamespaceOptions(),
		}},
	}
	if sb.IP != "" {
		st.Network = &runtime.PodSandboxNetworkStatus{Ip: sb.IP}
		for _, ip := range sb.AdditionalIPs {
			st.Network.AdditionalIps = append(st.Network.AdditionalIps, &runtime.PodIP{Ip: ip})
		}
	}
	return st
}
