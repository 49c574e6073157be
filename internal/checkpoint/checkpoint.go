// Package checkpoint is what berth's container and pod checkpoints are
// made of (KEP-2008, CRI CheckpointContainer, CheckpointPod, RestorePod):
// the criu binary and its health check, the layout of a container
// checkpoint (the one CRI-O, containerd and checkpointctl read), the
// rootfs diff of an overlay upper dir and its application, and tar
// archives of a checkpoint directory. Running runc checkpoint and restore
// belongs to the container store and the shim.
package checkpoint

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
)

// The files of a container checkpoint, named as checkpointctl's lib
// (metadata.go) names them: CRI-O and containerd write the same.
const (
	// ImagesDir holds CRIU's images (runc checkpoint --image-path).
	ImagesDir = "checkpoint"
	// ConfigDump is ContainerConfig as JSON.
	ConfigDump = "config.dump"
	// SpecDump is the container's OCI spec (its bundle's config.json).
	SpecDump = "spec.dump"
	// RootfsDiffTar holds the files the container wrote or changed in its
	// writable layer (the overlay upper dir).
	RootfsDiffTar = "rootfs-diff.tar"
	// DeletedFiles lists, as JSON, the image's files the container
	// removed (the upper dir's whiteouts).
	DeletedFiles = "deleted.files"
	// DumpLog is CRIU's log of the dump.
	DumpLog = "dump.log"
	// StatsDump is CRIU's statistics of the dump.
	StatsDump = "stats-dump"
)

// PodDump is the file at the top of a pod checkpoint (CheckpointPod's
// output_path): PodManifest as JSON. Each container's checkpoint is the
// directory named after its CRI metadata name beside it.
const PodDump = "pod.dump"

// ContainerConfig is config.dump: what checkpointctl and the restore
// tooling of CRI-O and containerd read about the checkpointed container.
type ContainerConfig struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	RootfsImage     string    `json:"rootfsImage,omitempty"`
	RootfsImageRef  string    `json:"rootfsImageRef,omitempty"`
	RootfsImageName string    `json:"rootfsImageName,omitempty"`
	OCIRuntime      string    `json:"runtime,omitempty"`
	CreatedTime     time.Time `json:"createdTime"`
	CheckpointedAt  time.Time `json:"checkpointedTime"`
	RestoredAt      time.Time `json:"restoredTime"`
	Restored        bool      `json:"restored"`
}

// PodManifestVersion is the version of pod.dump berth writes and reads.
const PodManifestVersion = 1

// PodManifest is pod.dump: the checkpointed pod and its containers.
type PodManifest struct {
	Version int    `json:"version"`
	Runtime string `json:"runtime"` // "berth"
	// PodID is the checkpointed sandbox; RuntimeHandler its handler.
	PodID          string    `json:"pod_id"`
	RuntimeHandler string    `json:"runtime_handler"`
	CheckpointedAt time.Time `json:"checkpointed_at"`
	// SandboxConfig is the pod's CRI config as protobuf JSON.
	SandboxConfig json.RawMessage `json:"sandbox_config,omitempty"`
	// Containers are the checkpointed containers by metadata name; each
	// one's checkpoint is the directory of that name.
	Containers []PodContainer `json:"containers"`
}

// PodContainer is one container of a pod checkpoint.
type PodContainer struct {
	Name string `json:"name"`
	ID   string `json:"id"`
}

// WriteJSON writes v as dir/name, atomically.
func WriteJSON(dir, name string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	return atomicfile.Write(filepath.Join(dir, name), data, 0o600)
}

// maxJSON bounds a checkpoint's JSON files (deleted.files, of a
// container that removed many image files, is the largest): they are
// read whole, and a checkpoint may come from outside.
const maxJSON = 64 << 20

// ReadJSON reads dir/name into v; a missing, bad or oversized file is
// InvalidArgument (the checkpoint is not one berth can read).
func ReadJSON(dir, name string, v any) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJSON+1))
	if err != nil {
		return fmt.Errorf("checkpoint %s: read %s: %v: %w", dir, name, err, errdefs.ErrInvalidArgument)
	}
	if len(data) > maxJSON {
		return fmt.Errorf("checkpoint %s: %s is larger than %d bytes: %w", dir, name, maxJSON, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("checkpoint %s: parse %s: %v: %w", dir, name, err, errdefs.ErrInvalidArgument)
	}
	return nil
}
