// Package specgen builds a container's OCI runtime spec from its CRI
// ContainerConfig, the pod's PodSandboxConfig and the image config.
//
// Build runs a fixed pipeline of small steps (process, user, mounts,
// devices, security, namespaces, resources, annotations). Each step reads
// the Input and fills its own part of the spec; each is tested on its own.
// Behaviour follows containerd's CRI plugin unless docs/specgen.md says
// otherwise. A field berth cannot honour is an error wrapping
// errdefs.ErrInvalidArgument, never silently dropped.
package specgen

import (
	"fmt"
	"io"
	"log/slog"

	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cdi"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/userns"
)

// Input is everything that shapes a container's OCI spec.
type Input struct {
	ContainerID   string
	Config        *runtime.ContainerConfig
	SandboxConfig *runtime.PodSandboxConfig
	// Image is the image config (User, Env, Entrypoint, Cmd, WorkingDir).
	Image *ocispecv1.Image
	// RootfsPath is the mounted rootfs; /etc/passwd and /etc/group are
	// read from it without following links out of it.
	RootfsPath string
	// ImageVolumes maps the container path of each image volume (a CRI
	// mount with an image) to where that image is mounted read-only on the
	// host, image_sub_path applied.
	ImageVolumes map[string]string
	// IDMappedMounts maps the container path of each CRI mount with ID
	// mappings to the idmapped copy of its host path the container
	// package made (runc 1.1 cannot idmap mounts itself).
	IDMappedMounts map[string]string
	Pod            Pod
	CgroupDriver   string // "cgroupfs" or "systemd"
	// OOMScoreAdjFloor is the lowest oom_score_adj the kernel lets the
	// daemon set (its own, without CAP_SYS_RESOURCE); lower requests clamp to it.
	OOMScoreAdjFloor int

	// TargetPIDNSPath is the PID namespace (/proc/<pid>/ns/pid) of the
	// container named by NamespaceOption.TargetId, for pid mode TARGET.
	TargetPIDNSPath string
	// Rlimits are the daemon's default rlimits for containers (from its
	// config); each is clamped to the daemon's own hard limit. None → the
	// container inherits the runtime's limits, as in containerd.
	Rlimits []specs.POSIXRlimit
	// AppArmor loads berth's RuntimeDefault profile and looks localhost
	// profiles up (internal/apparmor); used only where AppArmor is on.
	// nil: RuntimeDefault is refused there and localhost profiles are
	// passed on unchecked.
	AppArmor AppArmorProfiles
	// CDI resolves the container's CDI devices (CDI_devices and
	// "cdi.k8s.io/" annotations); nil refuses any.
	CDI *cdi.Registry
	// Host describes the machine; nil → ProbeHost() is called.
	Host *Host
	// Logger receives debug notes (ignored security labels); nil → discard.
	Logger *slog.Logger
}

// AppArmorProfiles are the AppArmor profiles of the host.
type AppArmorProfiles interface {
	// Default loads berth's RuntimeDefault profile if needed and names it.
	Default() (string, error)
	// Loaded reports whether the kernel has the named profile.
	Loaded(name string) (bool, error)
}

// Pod is the part of the sandbox a container joins.
type Pod struct {
	ID, NetNSPath, IPCNSPath, UTSNSPath, PIDNSPath, CgroupParent string
	HostnamePath, HostsPath, ResolvConfPath, ShmPath             string
	// UserNSPath pins the pod's own user namespace and UserNS is its
	// mapping; "" and nil when the pod uses the host's.
	UserNSPath string
	UserNS     *userns.Mapping
}

// step fills one part of the spec from the Input.
type step struct {
	name  string
	apply func(in *Input, s *specs.Spec) error
}

// pipeline is the order of steps. Later steps may read what earlier ones
// wrote only where noted: seccomp reads the capabilities (the default
// profile allows some syscalls per capability), privileged overrides the
// security steps before it, cdi edits what the steps before it made
// (its device nodes take the user's uid/gid, its mounts are sorted in).
var pipeline = []step{
	{"unsupported", refuseUnsupported},
	{"process", applyProcess},
	{"user", applyUser},
	{"mounts", applyMounts},
	{"devices", applyDevices},
	{"capabilities", applyCapabilities},
	{"paths", applyMaskedPaths},
	{"privileged", applyPrivileged},
	{"cdi", applyCDI},
	{"seccomp", applySeccomp},
	{"lsm", applyLSM},
	{"namespaces", applyNamespaces},
	{"sysctls", applySysctls},
	{"resources", applyResources},
	{"cgroups path", applyCgroupsPath},
	{"annotations", applyAnnotations},
}

// Build returns the OCI spec for in. spec.Root.Path is left for the caller
// (the rootfs it mounted). Errors for bad config wrap
// errdefs.ErrInvalidArgument.
func Build(in Input) (*specs.Spec, error) {
	if in.Config == nil {
		return nil, fmt.Errorf("container config is required: %w", errdefs.ErrInvalidArgument)
	}
	if in.SandboxConfig == nil {
		return nil, fmt.Errorf("sandbox config is required: %w", errdefs.ErrInvalidArgument)
	}
	if in.ContainerID == "" {
		return nil, fmt.Errorf("container ID is required: %w", errdefs.ErrInvalidArgument)
	}
	if in.Image == nil {
		in.Image = &ocispecv1.Image{}
	}
	if in.Host == nil {
		h, err := ProbeHost()
		if err != nil {
			return nil, fmt.Errorf("probe host: %w", err)
		}
		in.Host = h
	}
	if in.Logger == nil {
		in.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	in.Logger = in.Logger.With("pod", in.Pod.ID, "container", in.ContainerID)

	s := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Readonly: in.Config.GetLinux().GetSecurityContext().GetReadonlyRootfs()},
		Process: &specs.Process{},
		Linux:   &specs.Linux{Resources: &specs.LinuxResources{}},
	}
	for _, st := range pipeline {
		if err := st.apply(&in, s); err != nil {
			return nil, fmt.Errorf("container %s: %s: %w", in.ContainerID, st.name, err)
		}
	}
	return s, nil
}

// invalid returns an error wrapping errdefs.ErrInvalidArgument.
func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// refuseUnsupported rejects config fields berth does not implement, so
// that they are never silently dropped.
func refuseUnsupported(in *Input, _ *specs.Spec) error {
	if in.Config.GetWindows() != nil {
		return invalid("windows container config on a Linux runtime")
	}
	return nil
}
