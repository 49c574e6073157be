package container

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/image"
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

// Container is one container's record, kept in <root>/containers/<id>/
// as container.json.
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

	// Restored is set for a container created from a checkpoint: its
	// start restores the checkpointed processes.
	Restored bool `json:"restored,omitempty"`

	State      State     `json:"state"`
	Pid        int       `json:"pid,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	ExitCode   int32     `json:"exit_code"`
	Reason     string    `json:"reason,omitempty"`
	Message    string    `json:"message,omitempty"`
}

// newRecord is the record of a container about to be created, a pure
// function of what its create resolved: the CRI request, the image, the
// image volumes as mounted (by the index of their CRI mount) and the final
// spec, whose process user is the one status reports.
func newRecord(id string, req CreateRequest, img *image.Image, vols []imageVolume, spec *specs.Spec, createdAt time.Time) *Container {
	cfg := req.Config
	c := &Container{
		ID: id, PodID: req.PodID, Name: cfg.GetMetadata().GetName(), Attempt: cfg.GetMetadata().GetAttempt(),
		Image: cfg.GetImage().GetImage(), ImageID: img.ID, ImageName: cfg.GetImage().GetImage(), ImageRef: img.ID,
		Labels: cfg.GetLabels(), Annotations: cfg.GetAnnotations(),
		LogPath: req.LogPath, Runtime: req.Runtime,
		Resources: cfg.GetLinux().GetResources(),
		Terminal:  cfg.GetTty(), Stdin: cfg.GetStdin(), StdinOnce: cfg.GetStdinOnce(),
		State: StateCreated, CreatedAt: createdAt, Restored: req.Restore != nil,
	}
	c.ImageName, c.ImageRef = statusImage(img, cfg.GetImage().GetUserSpecifiedImage(), c.Image)
	// KEP-4960: the config's stop signal, else the image's.
	if c.StopSignal = req.StopSignal; c.StopSignal == "" && img.Config != nil {
		c.StopSignal = img.Config.Config.StopSignal
	}
	volAt := map[int]imageVolume{}
	for _, v := range vols {
		volAt[v.index] = v
		c.VolumeOwners = append(c.VolumeOwners, v.owner)
	}
	for n, m := range cfg.GetMounts() {
		if m.GetImage() != nil {
			if v, ok := volAt[n]; ok {
				c.Mounts = append(c.Mounts, v.mount)
			}
			continue
		}
		c.Mounts = append(c.Mounts, Mount{
			ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), Readonly: m.GetReadonly(),
			SelinuxRelabel: m.GetSelinuxRelabel(), Propagation: int32(m.GetPropagation()),
		})
	}
	if spec != nil && spec.Process != nil {
		u := spec.Process.User
		c.User = &User{UID: int64(u.UID), GID: int64(u.GID), Username: u.Username}
		for _, g := range u.AdditionalGids {
			c.User.Supplemental = append(c.User.Supplemental, int64(g))
		}
		if c.User.Username == "" {
			c.User.Username = cfg.GetLinux().GetSecurityContext().GetRunAsUsername()
		}
	}
	return c
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

// recordFile is a container's record in its directory.
const recordFile = "container.json"

// loadRecord reads container id's record.
func (s *Store) loadRecord(id string) (*Container, error) {
	c, err := s.records.Load(id)
	if err != nil {
		return nil, err
	}
	if c.Version != recordVersion {
		return nil, fmt.Errorf("%s: unsupported record version %d", s.records.Path(id), c.Version)
	}
	return c, nil
}

// saveRecord writes the record durably.
func (s *Store) saveRecord(c *Container) error {
	c.Version = recordVersion
	return s.records.Save(c.ID, c)
}

// saveRecordSoon writes the record at once and has it fsynced right after
// (decision 1600): what CreateContainer and StartContainer record. A
// restarted berthd reads the page cache; a power loss stops every container,
// and an older, missing or empty record of a container that no longer runs
// is recovered as such (a directory without a valid record is removed, a
// created record whose pod no monitor serves any more is exited).
func (s *Store) saveRecordSoon(c *Container) error {
	c.Version = recordVersion
	return s.records.SaveSoon(c.ID, c)
}

// statusImage is the repo tag and repo digest status reports for a
// container of img: the tag the user asked for (the kubelet's
// user_specified_image, else the config's image) when it is one of the
// image's tags, else the image's first tag (else the config's image); the
// repo digest in that tag's repository, else the first (else the image
// ID). An image stored under several tags of one digest reports the tag
// its pod names, as containerd's first tag does not (kubernetes#51017);
// the node e2e suite checks that an updated sidecar reports its new image.
func statusImage(img *image.Image, asked ...string) (name, ref string) {
	name, ref = asked[len(asked)-1], img.ID
	if len(img.RepoTags) > 0 {
		name = img.RepoTags[0]
	}
	for _, a := range asked {
		if a == "" {
			continue
		}
		n, err := image.ParseReference(a)
		if err != nil || n.Tag == "" {
			continue
		}
		if slices.Contains(img.RepoTags, n.TagRef()) {
			name = n.TagRef()
			break
		}
	}
	if len(img.RepoDigests) > 0 {
		ref = img.RepoDigests[0]
		if n, err := image.ParseReference(name); err == nil {
			for _, d := range img.RepoDigests {
				if strings.HasPrefix(d, n.Repo()+"@") {
					ref = d
					break
				}
			}
		}
	}
	return name, ref
}
