package nri

import (
	"maps"
	"strconv"
	"strings"

	api "github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/specgen"
)

// podToNRI describes a sandbox as NRI plugins see it.
func podToNRI(sb *sandbox.Sandbox, host *specgen.Host) *api.PodSandbox {
	md := sb.Config.GetMetadata()
	p := &api.PodSandbox{
		Id:             sb.ID,
		Name:           md.GetName(),
		Uid:            md.GetUid(),
		Namespace:      md.GetNamespace(),
		Labels:         maps.Clone(sb.Config.GetLabels()),
		Annotations:    maps.Clone(sb.Config.GetAnnotations()),
		RuntimeHandler: sb.RuntimeHandler,
		Linux: &api.LinuxPodSandbox{
			CgroupParent: sb.Config.GetLinux().GetCgroupParent(),
			CgroupsPath:  sb.CgroupParent,
			PodOverhead:  criResourcesToNRI(sb.Overhead, host),
			PodResources: criResourcesToNRI(sb.Resources, host),
			Resources:    criResourcesToNRI(sb.Resources, host),
		},
	}
	for _, ns := range []struct {
		typ  specs.LinuxNamespaceType
		path string
	}{
		{specs.NetworkNamespace, sb.NetNSPath},
		{specs.IPCNamespace, sb.IPCNSPath},
		{specs.UTSNamespace, sb.UTSNSPath},
		{specs.PIDNamespace, sb.PIDNSPath},
	} {
		if ns.path != "" {
			p.Linux.Namespaces = append(p.Linux.Namespaces, &api.LinuxNamespace{Type: string(ns.typ), Path: ns.path})
		}
	}
	if sb.IP != "" {
		p.Ips = append([]string{sb.IP}, sb.AdditionalIPs...)
	}
	// Only a pod with a shared PID namespace has a process of its own
	// (berth-pause); its namespace path names it.
	if rest, ok := strings.CutPrefix(sb.PIDNSPath, "/proc/"); ok {
		if pid, err := strconv.ParseUint(strings.TrimSuffix(rest, "/ns/pid"), 10, 32); err == nil {
			p.Pid = uint32(pid)
		}
	}
	return p
}

// podStub stands for a pod that is gone from the store (removed while an
// event about one of its containers was on its way).
func podStub(id string) *api.PodSandbox { return &api.PodSandbox{Id: id} }

// criResourcesToNRI converts CRI resources as create does (one
// conversion, the host's swap accounting); nil stays nil.
func criResourcesToNRI(r *runtime.LinuxContainerResources, host *specgen.Host) *api.LinuxResources {
	if r == nil {
		return nil
	}
	return api.FromOCILinuxResources(specgen.Resources(r, host), nil)
}

// containerToNRI describes a container from its record and OCI spec (nil
// when it is not readable: the static part is then left empty).
func containerToNRI(c *container.Container, spec *specs.Spec) *api.Container {
	ctr := &api.Container{
		Id:           c.ID,
		PodSandboxId: c.PodID,
		Name:         c.Name,
		Labels:       maps.Clone(c.Labels),
		Annotations:  maps.Clone(c.Annotations),
	}
	setStatus(ctr, c)
	if c.ImageName != "" || c.ImageRef != "" {
		ctr.Image = &api.Image{Name: c.ImageName}
		if i := strings.LastIndex(c.ImageRef, "@"); i >= 0 {
			ctr.Image.Digest = c.ImageRef[i+1:]
		}
	}
	if spec == nil {
		return ctr
	}
	if len(spec.Annotations) > 0 {
		// The spec's annotations include what plugins added at creation.
		ctr.Annotations = maps.Clone(spec.Annotations)
	}
	if p := spec.Process; p != nil {
		ctr.Args = append([]string(nil), p.Args...)
		ctr.Env = append([]string(nil), p.Env...)
		ctr.User = &api.User{Uid: p.User.UID, Gid: p.User.GID, AdditionalGids: append([]uint32(nil), p.User.AdditionalGids...)}
		for _, r := range p.Rlimits {
			ctr.Rlimits = append(ctr.Rlimits, &api.POSIXRlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
		}
	}
	ctr.Mounts = api.FromOCIMounts(spec.Mounts)
	ctr.Hooks = api.FromOCIHooks(spec.Hooks)
	if l := spec.Linux; l != nil {
		lc := &api.LinuxContainer{
			Namespaces:  api.FromOCILinuxNamespaces(l.Namespaces),
			Devices:     api.FromOCILinuxDevices(l.Devices),
			Resources:   api.FromOCILinuxResources(l.Resources, spec.Annotations),
			CgroupsPath: l.CgroupsPath,
			Sysctl:      maps.Clone(l.Sysctl),
		}
		if spec.Process != nil && spec.Process.OOMScoreAdj != nil {
			lc.OomScoreAdj = api.Int(*spec.Process.OOMScoreAdj)
		}
		if spec.Process != nil && spec.Process.IOPriority != nil {
			lc.IoPriority = api.FromOCILinuxIOPriority(spec.Process.IOPriority)
		}
		if l.Seccomp != nil {
			lc.SeccompPolicy = api.FromOCILinuxSeccomp(l.Seccomp)
		}
		ctr.Linux = lc
	}
	return ctr
}

// setStatus copies the changing part of a record: state, pid, times, exit.
func setStatus(ctr *api.Container, c *container.Container) {
	switch c.State {
	case container.StateCreated:
		ctr.State = api.ContainerState_CONTAINER_CREATED
	case container.StateRunning:
		ctr.State = api.ContainerState_CONTAINER_RUNNING
	case container.StateExited:
		ctr.State = api.ContainerState_CONTAINER_STOPPED
	default:
		ctr.State = api.ContainerState_CONTAINER_UNKNOWN
	}
	if c.Pid > 0 {
		ctr.Pid = uint32(c.Pid)
	}
	ctr.CreatedAt = unixNano(c.CreatedAt.UnixNano(), c.CreatedAt.IsZero())
	ctr.StartedAt = unixNano(c.StartedAt.UnixNano(), c.StartedAt.IsZero())
	ctr.FinishedAt = unixNano(c.FinishedAt.UnixNano(), c.FinishedAt.IsZero())
	ctr.ExitCode = c.ExitCode
	ctr.StatusReason = c.Reason
	ctr.StatusMessage = c.Message
}

func unixNano(n int64, zero bool) int64 {
	if zero {
		return 0
	}
	return n
}
