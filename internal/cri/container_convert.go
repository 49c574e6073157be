package cri

import (
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

func criContainerState(s container.State) runtime.ContainerState {
	switch s {
	case container.StateCreated:
		return runtime.ContainerState_CONTAINER_CREATED
	case container.StateRunning:
		return runtime.ContainerState_CONTAINER_RUNNING
	case container.StateExited:
		return runtime.ContainerState_CONTAINER_EXITED
	}
	return runtime.ContainerState_CONTAINER_UNKNOWN
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func criContainer(c *container.Container) *runtime.Container {
	return &runtime.Container{
		Id:           c.ID,
		PodSandboxId: c.PodID,
		Metadata:     &runtime.ContainerMetadata{Name: c.Name, Attempt: c.Attempt},
		Image:        &runtime.ImageSpec{Image: c.Image},
		ImageRef:     c.ImageID,
		ImageId:      c.ImageID,
		State:        criContainerState(c.State),
		CreatedAt:    unixNano(c.CreatedAt),
		Labels:       c.Labels,
		Annotations:  c.Annotations,
	}
}

func criContainerStatus(c *container.Container) *runtime.ContainerStatus {
	st := &runtime.ContainerStatus{
		Id:          c.ID,
		Metadata:    &runtime.ContainerMetadata{Name: c.Name, Attempt: c.Attempt},
		State:       criContainerState(c.State),
		CreatedAt:   unixNano(c.CreatedAt),
		StartedAt:   unixNano(c.StartedAt),
		FinishedAt:  unixNano(c.FinishedAt),
		ExitCode:    c.ExitCode,
		Image:       &runtime.ImageSpec{Image: c.ImageName},
		ImageRef:    c.ImageRef,
		ImageId:     c.ImageID,
		Reason:      c.Reason,
		Message:     c.Message,
		Labels:      c.Labels,
		Annotations: c.Annotations,
		LogPath:     c.LogPath,
		StopSignal:  criStopSignal(c.StopSignal),
	}
	for _, m := range c.Mounts {
		cm := &runtime.Mount{
			ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.Readonly,
			SelinuxRelabel: m.SelinuxRelabel, Propagation: runtime.MountPropagation(m.Propagation),
		}
		if m.Image != "" {
			// An image volume: what was asked and the image ID it resolved to.
			cm.Image = &runtime.ImageSpec{Image: m.Image, ImageRef: m.ImageRef}
			cm.ImageSubPath = m.ImageSubPath
		}
		st.Mounts = append(st.Mounts, cm)
	}
	if c.Resources != nil {
		st.Resources = &runtime.ContainerResources{Linux: c.Resources}
	}
	if c.User != nil {
		st.User = &runtime.ContainerUser{Linux: &runtime.LinuxContainerUser{
			Uid: c.User.UID, Gid: c.User.GID, SupplementalGroups: c.User.Supplemental,
		}}
	}
	return st
}
