package sandbox

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/userns"
)

// recordVersion is bumped when the format changes incompatibly.
const recordVersion = "v1"

// recordFile is a sandbox's record in <root>/sandboxes/<id>/, named for
// its kind as a container's container.json. legacyRecordFile is its name
// before decision 2600: New renames one it finds.
const (
	recordFile       = "sandbox.json"
	legacyRecordFile = "checkpoint.json"
)

// record is one sandbox on disk: everything needed to list it, stop it
// (CNI DEL with the config ADD used) and remove it after a daemon
// restart. (A "checkpoint" in berth is only ever a CRIU one.)
type record struct {
	Version        string          `json:"version"`
	ID             string          `json:"id"`
	Config         json.RawMessage `json:"config"` // PodSandboxConfig, protojson
	RuntimeHandler string          `json:"runtimeHandler"`
	// State is SANDBOX_READY or SANDBOX_NOTREADY as last recorded.
	State     string    `json:"state"`
	CreatedAt time.Time `json:"createdAt"`

	NetNSPath  string `json:"netnsPath,omitempty"`
	IPCNSPath  string `json:"ipcnsPath,omitempty"`
	UTSNSPath  string `json:"utsnsPath,omitempty"`
	PausePID   int    `json:"pausePid,omitempty"`
	PauseStart uint64 `json:"pauseStart,omitempty"`
	// UsernsPath and Userns: the pod's own user namespace, if any.
	UsernsPath string          `json:"usernsPath,omitempty"`
	Userns     *userns.Mapping `json:"userns,omitempty"`

	CgroupParent   string `json:"cgroupParent"`
	CgroupUnit     string `json:"cgroupUnit,omitempty"`
	HostnamePath   string `json:"hostnamePath"`
	HostsPath      string `json:"hostsPath"`
	ResolvConfPath string `json:"resolvConfPath"`
	ShmPath        string `json:"shmPath,omitempty"`

	PortMappings []network.PortMapping `json:"portMappings,omitempty"`
	// Network is the CNI attachment: config list, result, IPs. Nil until
	// ADD succeeded and after DEL succeeded.
	Network *network.Attachment `json:"network,omitempty"`
}

func (r *entry) toRecord() (*record, error) {
	cfg, err := protojson.Marshal(r.sb.Config)
	if err != nil {
		return nil, fmt.Errorf("encode sandbox config: %w", err)
	}
	sb := r.sb
	return &record{
		Version: recordVersion, ID: sb.ID, Config: cfg, RuntimeHandler: sb.RuntimeHandler,
		State: sb.State.String(), CreatedAt: sb.CreatedAt,
		NetNSPath: sb.NetNSPath, IPCNSPath: sb.IPCNSPath, UTSNSPath: sb.UTSNSPath,
		PausePID: r.pausePID, PauseStart: r.pauseStart,
		UsernsPath: sb.UserNSPath, Userns: sb.UserNS,
		CgroupParent: sb.CgroupParent, CgroupUnit: sb.CgroupUnit, HostnamePath: sb.HostnamePath, HostsPath: sb.HostsPath,
		ResolvConfPath: sb.ResolvConfPath, ShmPath: sb.ShmPath,
		PortMappings: r.ports, Network: r.attachment,
	}, nil
}

func (c *record) toEntry() (*entry, error) {
	if c.Version != recordVersion {
		return nil, fmt.Errorf("record version %q, want %q", c.Version, recordVersion)
	}
	cfg := &runtime.PodSandboxConfig{}
	if err := protojson.Unmarshal(c.Config, cfg); err != nil {
		return nil, fmt.Errorf("decode sandbox config: %w", err)
	}
	state := runtime.PodSandboxState_SANDBOX_NOTREADY
	if c.State == runtime.PodSandboxState_SANDBOX_READY.String() {
		state = runtime.PodSandboxState_SANDBOX_READY
	}
	r := &entry{
		sb: Sandbox{
			ID: c.ID, Config: cfg, RuntimeHandler: c.RuntimeHandler, State: state, CreatedAt: c.CreatedAt,
			NetNSPath: c.NetNSPath, IPCNSPath: c.IPCNSPath, UTSNSPath: c.UTSNSPath,
			UserNSPath: c.UsernsPath, UserNS: c.Userns,
			CgroupParent: c.CgroupParent, CgroupUnit: c.CgroupUnit, HostnamePath: c.HostnamePath, HostsPath: c.HostsPath,
			ResolvConfPath: c.ResolvConfPath, ShmPath: c.ShmPath,
		},
		pausePID: c.PausePID, pauseStart: c.PauseStart,
		ports: c.PortMappings, attachment: c.Network,
	}
	if c.PausePID > 0 {
		r.sb.PIDNSPath = fmt.Sprintf("/proc/%d/ns/pid", c.PausePID)
	}
	r.fillFromAttachment()
	return r, nil
}
