package container

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/berthcri/berth/internal/atomicfile"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// recordVersion is the version of container.json.
const recordVersion = 1

// State is a container's lifecycle state (seed 000: created → running →
// exited → removed; nothing else).
type State string

// States.
const (
	StateCreated State = "created"
	StateRunning State = "running"
	StateExited  State = "exited"
)

// Exit reasons as kubelet expects them.
const (
	ReasonCompleted = "Completed"
	ReasonError     = "Error"
	ReasonOOMKilled = "OOMKilled"
	ReasonStart     = "StartError"
	ReasonUnknown   = "Unknown"
)

// Mount is one mount of the container, as status reports it.
type Mount struct {
	ContainerPath  string `json:"container_path"`
	HostPath       string `json:"host_path"`
	Readonly       bool   `json:"readonly,omitempty"`
	SelinuxRelabel bool   `json:"selinux_relabel,omitempty"`
	Propagation    int32  `json:"propagation,omitempty"`
	// Image and ImageRef (the image ID, as PullImage returned it) are set
	// for an image volume; ImageSubPath is the part of it mounted.
	Image        string `json:"image,omitempty"`
	ImageRef     string `json:"image_ref,omitempty"`
	ImageSubPath string `json:"image_sub_path,omitempty"`
}

// User is the identity the container's process runs as.
type User struct {
	UID          int64   `json:"uid"`
	GID          int64   `json:"gid"`
	Supplemental []int64 `json:"supplemental_groups,omitempty"`
	Username     string  `json:"username,omitempty"`
}

// Container is one container's record, kept in <root>/containers/<id>/.
type Container struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	PodID   string `json:"pod_id"`
	Name    string `json:"name"`
	Attempt uint32 `json:"attempt"`

	// Image is what the config asked for; ImageID the resolved image;
	// ImageName a repo tag (or the request) and ImageRef a repo digest (or
	// the ID), as status reports them.
	Image     string `json:"image"`
	ImageID   string `json:"image_id"`
	ImageName string `json:"image_name"`
	ImageRef  string `json:"image_ref"`

	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	LogPath     string            `json:"log_path,omitempty"`
	Runtime     string            `json:"runtime_handler"`
	StopSignal  string            `json:"stop_signal,omitempty"`
	Mounts      []Mount           `json:"mounts,omitempty"`
	// VolumeOwners are the image lease owners of the image volumes,
	// released on remove.
	VolumeOwners []string `json:"volume_owners,omitempty"`
	User         *User    `json:"user,omitempty"`
	// Resources are the CRI resources last applied (create or update).
	Resources *runtime.LinuxContainerResources `json:"resources,omitempty"`
	Terminal  bool                             `json:"tty,omitempty"`
	Stdin     bool                             `json:"stdin,omitempty"`
	StdinOnce bool                             `json:"stdin_once,omitempty"`

	State      State     `json:"state"`
	Pid        int       `json:"pid,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	ExitCode   int32     `json:"exit_code"`
	Reason     string    `json:"reason,omitempty"`
	Message    string    `json:"message,omitempty"`
}

func (c *Container) clone() *Container {
	cp := *c
	return &cp
}

func newID() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

func recordPath(dir string) string { return filepath.Join(dir, "container.json") }

func loadRecord(dir string) (*Container, error) {
	data, err := os.ReadFile(recordPath(dir))
	if err != nil {
		return nil, err
	}
	var c Container
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("parse %s: %w", recordPath(dir), err)
	}
	if c.Version != recordVersion {
		return nil, fmt.Errorf("%s: unsupported record version %d", recordPath(dir), c.Version)
	}
	return &c, nil
}

func saveRecord(dir string, c *Container) error {
	c.Version = recordVersion
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode container %s: %w", c.ID, err)
	}
	return atomicfile.Write(recordPath(dir), data, 0o600)
}
