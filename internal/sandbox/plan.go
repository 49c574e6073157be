package sandbox

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/cgroupplan"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/userns"
)

// A pod sandbox is made in three steps, as a container is (create.go in
// internal/container):
//
//	p, err := planPod(host, cfg, handler) // pure: validation, paths, namespaces, cgroups, files
//	d := s.newDraft(p)                    // makes it, step by step, keeping each step's undo
//	defer d.discard(ctx)                  // undoes them, last first, unless committed
//	d.prepare(ctx); d.build(ctx)          // name, record, namespaces, CNI ∥ files and cgroup
//	sb, err := d.commit(ctx, hooks)       // hooks, READY record, published
//
// The plan reads the node only through planHost, so unit tests plan pods
// without root, runc or CNI.

// planHost is what planning a pod reads of berthd's configuration and of
// the node. Store.planHost gives the real ones.
type planHost struct {
	// sandboxes is <root>/sandboxes, netns <state>/netns, state
	// <state>/sandboxes.
	sandboxes, netns, state string
	// noSystemd is set when the systemd cgroup driver is configured
	// without a connection to systemd.
	noSystemd bool
	// cgroupName names a pod's cgroup for the configured driver: the
	// slice unit (systemd) or the cgroupfs path (Store.podCgroupName).
	cgroupName func(configParent, id string) (unit, path string, err error)
	// cgroupfsPlan plans a cgroupfs pod cgroup on this host (cgroupfsPlan).
	cgroupfsPlan func(id, pod string, holder bool) cgroupplan.Plan
	newID        func() string
	now          func() time.Time
	// hostname and readFile read the host's name and files (/etc/hosts,
	// /etc/resolv.conf).
	hostname func() (string, error)
	readFile func(string) ([]byte, error)
	// pauseBinary finds berth-pause; usernsSupport says why pods with
	// their own user namespace cannot run here (nil when they can).
	pauseBinary   func() (string, error)
	usernsSupport func() error
}

// podPlan is a pod sandbox worked out before anything of it exists.
type podPlan struct {
	// sb is the sandbox as its first record has it: NOTREADY, with every
	// path chosen. IP, PIDNSPath and (systemd) CgroupParent come later.
	sb Sandbox
	// name is its reservation key.
	name string
	// dir is <root>/sandboxes/<id> (record, pod files), stateDir
	// <state>/sandboxes/<id> (/dev/shm, the holder's argument).
	dir, stateDir string
	// attach is set when the pod has a network of its own (CNI).
	attach bool
	ports  []network.PortMapping
	// ns says which namespaces to make and what to set in them.
	ns nsRequest
	// files are the pod's hostname, hosts and resolv.conf, owned by the
	// pod's root when it has a user namespace.
	files []podFile
	// shmOptions mounts the pod's /dev/shm (at sb.ShmPath, unless "").
	shmOptions string
	// cgroups is the cgroupfs driver's plan; nil under systemd, where
	// systemd makes the pod slice sb.CgroupUnit.
	cgroups *cgroupplan.Plan
	// holder is set when berth-pause runs for the pod (a PID namespace
	// shared by the pod, or a user namespace).
	holder bool
}

// podFile is one file of the pod, written before its containers exist.
type podFile struct {
	path string
	data []byte
}

// planPod validates cfg and plans the pod; every error names what is
// wrong with an errdefs kind (InvalidArgument for the request,
// FailedPrecondition for the node). handler is already admitted.
func planPod(h *planHost, cfg *runtime.PodSandboxConfig, handler string) (*podPlan, error) {
	md := cfg.GetMetadata()
	if md.GetName() == "" || md.GetNamespace() == "" || md.GetUid() == "" {
		return nil, fmt.Errorf("sandbox metadata needs name, namespace and uid: %w", errdefs.ErrInvalidArgument)
	}
	// The monitor resolves the log directory the ordinary way and nothing
	// below it (shim/monitor openLogFile): no ".." may hide in it.
	if dir := cfg.GetLogDirectory(); dir != "" && (!filepath.IsAbs(dir) || filepath.Clean(dir) != dir) {
		return nil, fmt.Errorf("log_directory %q is not an absolute clean path: %w", dir, errdefs.ErrInvalidArgument)
	}
	if h.noSystemd {
		return nil, fmt.Errorf("the systemd cgroup driver has no connection to systemd: %w", errdefs.ErrFailedPrecondition)
	}
	p := &podPlan{name: reservationKey(md)}
	w, err := planNamespaces(h, cfg)
	if err != nil {
		return nil, err
	}
	if p.ports, err = planPorts(cfg.GetPortMappings()); err != nil {
		return nil, err
	}
	hostname := cfg.GetHostname()
	if hostname == "" {
		// The kubelet always sets one; others get the pod name, cut to
		// the kernel's limit as the kubelet does.
		hostname = strings.TrimRight(truncate(md.GetName(), 63), "-.")
	}
	if len(hostname) > 64 {
		return nil, fmt.Errorf("hostname %q is longer than 64 bytes: %w", hostname, errdefs.ErrInvalidArgument)
	}
	var pauseBin string
	if p.holder = w.holder(); p.holder {
		if pauseBin, err = h.pauseBinary(); err != nil {
			return nil, err
		}
	}

	id := h.newID()
	unit, cgroup, err := h.cgroupName(cfg.GetLinux().GetCgroupParent(), id)
	if err != nil {
		return nil, err
	}
	p.dir, p.stateDir = filepath.Join(h.sandboxes, id), filepath.Join(h.state, id)
	p.sb = Sandbox{
		ID: id, Config: proto.Clone(cfg).(*runtime.PodSandboxConfig), RuntimeHandler: handler,
		State: runtime.PodSandboxState_SANDBOX_NOTREADY, CreatedAt: h.now(),
		CgroupParent: cgroup, CgroupUnit: unit,
		HostnamePath: filepath.Join(p.dir, "hostname"), HostsPath: filepath.Join(p.dir, "hosts"),
		ResolvConfPath: filepath.Join(p.dir, "resolv.conf"),
	}
	p.placeNamespaces(h, w, hostname, pauseBin)
	if unit == "" {
		plan := h.cgroupfsPlan(id, cgroup, p.holder)
		p.cgroups = &plan
	}
	if err := p.planFiles(h, hostname); err != nil {
		return nil, err
	}
	return p, nil
}

// nsWanted is which namespaces a pod shares with the host and which it
// gets, before their pins have paths.
type nsWanted struct {
	hostNet, hostIPC bool
	// podPID: the pod's containers share a PID namespace, held by
	// berth-pause.
	podPID bool
	// userns is the pod's own user namespace, held by berth-pause too;
	// nil for the host's.
	userns  *userns.Mapping
	sysctls map[string]string
}

// holder reports whether berth-pause runs for the pod.
func (w nsWanted) holder() bool { return w.podPID || w.userns != nil }

// planNamespaces works out the pod's namespaces, refusing combinations
// that cannot work, and the sysctls to set in its own.
func planNamespaces(h *planHost, cfg *runtime.PodSandboxConfig) (nsWanted, error) {
	nsOpts := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	w := nsWanted{
		hostNet: nsOpts.GetNetwork() == runtime.NamespaceMode_NODE,
		hostIPC: nsOpts.GetIpc() == runtime.NamespaceMode_NODE,
		podPID:  nsOpts.GetPid() == runtime.NamespaceMode_POD,
	}
	var err error
	if w.userns, err = userns.FromCRI(nsOpts.GetUsernsOptions()); err != nil {
		return w, err
	}
	if w.userns != nil {
		// As the kubelet's validation: a pod with its own user namespace
		// shares neither the host's IPC nor PID namespace, whose owner it
		// could not use (the container's mqueue and /proc mounts would
		// fail). The host's network is allowed (KEP-5607): the container
		// gets the host's /sys bound read-only instead of a sysfs of its
		// own (specgen), and holds no capability over the host's network.
		if w.hostIPC || nsOpts.GetPid() == runtime.NamespaceMode_NODE {
			return w, fmt.Errorf("a pod with its own user namespace cannot use the host's IPC or PID namespace (host network is allowed): %w", errdefs.ErrInvalidArgument)
		}
		if err := h.usernsSupport(); err != nil {
			return w, fmt.Errorf("user namespace pod: %w: %w", err, errdefs.ErrFailedPrecondition)
		}
	}
	if w.sysctls, err = validateSysctls(cfg.GetLinux().GetSysctls(), w.hostNet, w.hostIPC); err != nil {
		return w, err
	}
	return w, nil
}

// placeNamespaces puts the pod's namespace pins, /dev/shm and holder
// processes at their paths, records them in the sandbox and says what
// createNamespaces makes.
func (p *podPlan) placeNamespaces(h *planHost, w nsWanted, hostname, pauseBin string) {
	id, sb := p.sb.ID, &p.sb
	if !w.hostNet {
		p.attach = true
		sb.NetNSPath = filepath.Join(h.netns, id+"-net")
		sb.UTSNSPath = filepath.Join(h.netns, id+"-uts")
	}
	if !w.hostIPC {
		sb.IPCNSPath = filepath.Join(h.netns, id+"-ipc")
		sb.ShmPath = filepath.Join(p.stateDir, "shm")
		p.shmOptions = fmt.Sprintf("mode=1777,size=%d", shmSize)
	}
	p.ns = nsRequest{netPin: sb.NetNSPath, ipcPin: sb.IPCNSPath, utsPin: sb.UTSNSPath, hostname: hostname, sysctls: w.sysctls}
	// The holder's argument, its state dir, makes it findable by path.
	if w.podPID {
		p.ns.pause = &pauseRequest{binary: pauseBin, arg: p.stateDir}
	}
	if w.userns != nil {
		sb.UserNSPath = filepath.Join(h.netns, id+"-user")
		sb.UserNS = w.userns
		p.ns.userns, p.ns.userPin = w.userns, sb.UserNSPath
		p.ns.holder = &pauseRequest{binary: pauseBin, arg: p.stateDir}
		if p.shmOptions != "" {
			p.shmOptions += fmt.Sprintf(",uid=%d,gid=%d", w.userns.UID.HostID, w.userns.GID.HostID)
		}
	}
}

// planPorts turns the CRI port mappings into the ones the network
// forwards: only those with a host port, as in kubelet.
func planPorts(in []*runtime.PortMapping) ([]network.PortMapping, error) {
	var ports []network.PortMapping
	for _, pm := range in {
		_, knownProto := runtime.Protocol_name[int32(pm.GetProtocol())]
		if !knownProto || pm.GetHostPort() < 0 || (pm.GetHostIp() != "" && net.ParseIP(pm.GetHostIp()) == nil) {
			return nil, fmt.Errorf("port mapping %v: %w", pm, errdefs.ErrInvalidArgument)
		}
		if pm.GetHostPort() == 0 {
			continue
		}
		if pm.GetContainerPort() <= 0 || pm.GetContainerPort() > 65535 || pm.GetHostPort() > 65535 {
			return nil, fmt.Errorf("port mapping %v: %w", pm, errdefs.ErrInvalidArgument)
		}
		ports = append(ports, network.PortMapping{
			HostPort: pm.GetHostPort(), ContainerPort: pm.GetContainerPort(),
			Protocol: strings.ToLower(pm.GetProtocol().String()), HostIP: pm.GetHostIp(),
		})
	}
	return ports, nil
}

// planFiles renders the pod's hostname, hosts and resolv.conf: a pod on
// the host's network gets the host's name and /etc/hosts, a pod without
// a DNS config the host's /etc/resolv.conf.
func (p *podPlan) planFiles(h *planHost, hostname string) error {
	hostNet := !p.attach
	if hostNet {
		var err error
		if hostname, err = h.hostname(); err != nil {
			return fmt.Errorf("read host name: %w", err)
		}
	}
	hosts, err := hostsContentFrom(h.readFile, hostNet)
	if err != nil {
		return err
	}
	resolv, err := resolvConfContentFrom(h.readFile, p.sb.Config.GetDnsConfig())
	if err != nil {
		return err
	}
	p.files = []podFile{
		{p.sb.HostnamePath, []byte(hostname + "\n")},
		{p.sb.HostsPath, hosts},
		{p.sb.ResolvConfPath, resolv},
	}
	return nil
}
