// Package network attaches pod network namespaces to a CNI network with
// libcni: the first config in the CNI config directory, or berth's embedded
// default bridge network when that directory holds none.
package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/tracing"
)

// IfName is the pod's interface name, as in every other CRI runtime.
const IfName = "eth0"

// Options configure a Network.
type Options struct {
	ConfDir string   // --cni-conf-dir
	BinDirs []string // plugin search path
	// CacheDir holds libcni's per-attachment result cache (under --state,
	// never the node-wide /var/lib/cni, so test daemons stay apart).
	CacheDir string
	// Default network: bridge name, subnet and host-local's dataDir.
	Bridge, Subnet, IPAMDataDir string
	Logger                      *slog.Logger
}

// Network runs CNI ADD and DEL for pods.
type Network struct {
	opts Options
	cni  *libcni.CNIConfig
	log  *slog.Logger

	mu     sync.Mutex
	loaded *loadedConf
	// variants are the embedded default network as Prepare hands it out.
	variants map[defaultVariant][]byte

	masqOnce sync.Once
	masqErr  error
}

// loadedConf remembers which file the config came from and its mtimes, so
// each call only pays a couple of stats to notice a changed directory.
type loadedConf struct {
	dirMod  time.Time
	file    string
	fileMod time.Time
	list    *libcni.NetworkConfigList
	err     error
}

// New builds a Network.
func New(opts Options) *Network {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Network{opts: opts, cni: libcni.NewCNIConfigWithCacheDir(opts.BinDirs, opts.CacheDir, nil), log: log,
		variants: map[defaultVariant][]byte{}}
}

// PortMapping is one hostPort → containerPort forward (portMappings
// capability, JSON as the portmap plugin reads it).
type PortMapping struct {
	HostPort      int32  `json:"hostPort"`
	ContainerPort int32  `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// Pod is what CNI needs to know about one pod.
type Pod struct {
	ID, Name, Namespace, UID string
	NetNSPath                string
	PortMappings             []PortMapping
}

// Attachment is the outcome of ADD, kept in the checkpoint so DEL can run
// with the very config ADD used.
type Attachment struct {
	// ConfList is the network config list as JSON.
	ConfList json.RawMessage `json:"confList"`
	// Result is the CNI result of ADD as JSON.
	Result json.RawMessage `json:"result,omitempty"`
	IPs    []string        `json:"ips,omitempty"`
}

// DefaultConfList renders the embedded default network.
func (n *Network) DefaultConfList() []byte {
	return DefaultConfList(n.opts.Bridge, n.opts.Subnet, n.opts.IPAMDataDir)
}

// DefaultConfList renders the embedded default network for a bridge, a
// subnet and host-local's dataDir: bridge (gateway, hairpin) with
// host-local IPAM, then portmap for hostPort mappings. Its pods'
// outgoing traffic is masqueraded by one node-level rule for the subnet
// (EnsureMasquerade, decision 1601), not per pod by the bridge plugin.
func DefaultConfList(bridge, subnet, ipamDataDir string) []byte {
	return defaultConfList(bridge, subnet, ipamDataDir, defaultVariant{portmap: true})
}

// defaultVariant is what Prepare leaves in or out of the embedded network
// for one pod.
type defaultVariant struct {
	// portmap: the pod has host ports.
	portmap bool
	// ipMasq: the node-level masquerade could not be installed, so the
	// bridge plugin masquerades per pod.
	ipMasq bool
}

func defaultConfList(bridge, subnet, ipamDataDir string, v defaultVariant) []byte {
	plugins := []any{
		map[string]any{
			"type":        "bridge",
			"bridge":      bridge,
			"isGateway":   true,
			"ipMasq":      v.ipMasq,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  []any{[]any{map[string]any{"subnet": subnet}}},
				"routes":  []any{map[string]any{"dst": "0.0.0.0/0"}},
				"dataDir": ipamDataDir,
			},
		},
	}
	if v.portmap {
		plugins = append(plugins, map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true})
	}
	conf := map[string]any{"cniVersion": "1.0.0", "name": "berth", "plugins": plugins}
	b, _ := json.Marshal(conf)
	return b
}

// EnsureMasquerade installs the embedded network's node-level masquerade
// rule (decision 1601). It runs once per Network; when it fails (no
// iptables) the bridge plugin masquerades each pod itself, as before.
func (n *Network) EnsureMasquerade() error {
	n.masqOnce.Do(func() {
		// Not a caller's context: the outcome is kept for every pod.
		n.masqErr = ensureMasquerade(context.Background(), n.opts.Bridge, n.opts.Subnet)
		if n.masqErr != nil {
			n.log.Warn("no node-level masquerade for the default network; the bridge plugin masquerades each pod", "bridge", n.opts.Bridge, "subnet", n.opts.Subnet, "err", n.masqErr)
		}
	})
	return n.masqErr
}

// Config returns the network config new pods attach to and where it came
// from ("" for the embedded default).
func (n *Network) Config() (*libcni.NetworkConfigList, string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var dirMod time.Time
	if fi, err := os.Stat(n.opts.ConfDir); err == nil {
		dirMod = fi.ModTime()
	}
	if l := n.loaded; l != nil && l.dirMod.Equal(dirMod) {
		if l.file == "" {
			return l.list, l.file, l.err
		}
		if fi, err := os.Stat(l.file); err == nil && fi.ModTime().Equal(l.fileMod) {
			return l.list, l.file, l.err
		}
	}
	l := &loadedConf{dirMod: dirMod}
	l.file, l.fileMod, l.list, l.err = n.load()
	n.loaded = l
	return l.list, l.file, l.err
}

func (n *Network) load() (string, time.Time, *libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(n.opts.ConfDir, []string{".conf", ".conflist", ".json"})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", time.Time{}, nil, fmt.Errorf("list CNI configs in %s: %w", n.opts.ConfDir, err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		list, err := libcni.ConfListFromBytes(n.DefaultConfList())
		if err != nil {
			return "", time.Time{}, nil, fmt.Errorf("embedded default network: %w", err)
		}
		return "", time.Time{}, list, nil
	}
	file := files[0]
	var mod time.Time
	if fi, err := os.Stat(file); err == nil {
		mod = fi.ModTime()
	}
	var list *libcni.NetworkConfigList
	if strings.HasSuffix(file, ".conflist") {
		list, err = libcni.ConfListFromFile(file)
	} else {
		list, err = singlePluginList(file)
	}
	if err != nil {
		return file, mod, nil, fmt.Errorf("load CNI config %s: %w", file, err)
	}
	if len(list.Plugins) == 0 {
		return file, mod, nil, fmt.Errorf("CNI config %s has no plugins", file)
	}
	// Keep one self-contained JSON form: plugins loaded from side files
	// are folded in, so the checkpoint alone can drive DEL later.
	list, err = normalise(list)
	if err != nil {
		return file, mod, nil, fmt.Errorf("CNI config %s: %w", file, err)
	}
	return file, mod, list, nil
}

// singlePluginList reads a .conf file (one plugin, name and cniVersion at
// the top) as a list of that one plugin.
func singlePluginList(file string) (*libcni.NetworkConfigList, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var head struct {
		Name       string          `json:"name"`
		CNIVersion string          `json:"cniVersion"`
		Plugins    json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("parse %s: %w", file, err)
	}
	if head.Plugins != nil { // a list after all (.json files may be either)
		return libcni.ConfListFromBytes(data)
	}
	b, err := json.Marshal(map[string]any{"cniVersion": head.CNIVersion, "name": head.Name, "plugins": []json.RawMessage{data}})
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}

func normalise(list *libcni.NetworkConfigList) (*libcni.NetworkConfigList, error) {
	plugins := make([]json.RawMessage, len(list.Plugins))
	for i, p := range list.Plugins {
		plugins[i] = p.Bytes
	}
	b, err := json.Marshal(map[string]any{"cniVersion": list.CNIVersion, "name": list.Name, "plugins": plugins})
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}

// Ready reports nil when pods can be attached: a config loads and every
// plugin it names is installed.
func (n *Network) Ready() error {
	list, file, err := n.Config()
	if err != nil {
		return err
	}
	for _, p := range list.Plugins {
		if _, err := n.findPlugin(p.Network.Type); err != nil {
			where := "embedded default network"
			if file != "" {
				where = file
			}
			return fmt.Errorf("%s: plugin %q not found in %v", where, p.Network.Type, n.opts.BinDirs)
		}
	}
	return nil
}

func (n *Network) findPlugin(name string) (string, error) {
	for _, dir := range n.opts.BinDirs {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errdefs.ErrNotFound
}

func runtimeConf(pod Pod) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: pod.ID,
		NetNS:       pod.NetNSPath,
		IfName:      IfName,
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", pod.Namespace},
			{"K8S_POD_NAME", pod.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", pod.ID},
			{"K8S_POD_UID", pod.UID},
		},
	}
	if len(pod.PortMappings) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": pod.PortMappings}
	}
	return rt
}

// ReservedIDs lists the pod IDs that hold addresses in the embedded
// network's host-local store (one file per address, the owner's ID on its
// first line), so recovery can find addresses no sandbox owns.
func (n *Network) ReservedIDs() []string {
	if n.opts.IPAMDataDir == "" {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(n.opts.IPAMDataDir, "*", "*"))
	seen := map[string]bool{}
	var ids []string
	for _, f := range files {
		base := filepath.Base(f)
		if base == "lock" || strings.HasPrefix(base, "last_reserved_ip") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		id, _, _ := strings.Cut(string(data), "\n")
		id = strings.TrimSpace(id)
		if id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// Prepare picks the config a new pod will attach with. The caller records
// it (checkpoint) before Attach, so a crash during ADD still leaves what
// DEL needs.
//
// On the embedded default network a pod without host ports attaches
// without its portmap plugin: portmap's ADD and DEL do nothing without
// port mappings, but each is one more plugin process (about 5 ms here)
// on every pod start. The attachment records the list it used, so DEL
// runs the same list. A config from cni_conf_dir is always run whole:
// berth does not know what its plugins do.
func (n *Network) Prepare(hostPorts bool) (*Attachment, error) {
	list, file, err := n.Config()
	if err != nil {
		return nil, fmt.Errorf("pod network config: %w", err)
	}
	if file != "" {
		return &Attachment{ConfList: list.Bytes}, nil
	}
	v := defaultVariant{portmap: hostPorts, ipMasq: n.EnsureMasquerade() != nil}
	return &Attachment{ConfList: n.defaultList(v)}, nil
}

// defaultList is a variant of the embedded default network, rendered once.
func (n *Network) defaultList(v defaultVariant) []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.variants[v]
	if !ok {
		b = defaultConfList(n.opts.Bridge, n.opts.Subnet, n.opts.IPAMDataDir, v)
		n.variants[v] = b
	}
	return b
}

// Attach runs CNI ADD for the pod with the prepared config and fills in
// the result. On failure the caller runs Detach: by the spec, DEL after a
// failed ADD releases what plugins earlier in the chain got.
func (n *Network) Attach(ctx context.Context, pod Pod, att *Attachment) error {
	list, err := libcni.ConfListFromBytes(att.ConfList)
	if err != nil {
		return fmt.Errorf("pod network config: %w", err)
	}
	ctx, span := tracing.Start(ctx, "cni.add", tracing.AttrPodID.String(pod.ID))
	res, err := n.cni.AddNetworkList(ctx, list, runtimeConf(pod))
	tracing.End(span, err)
	if err != nil {
		return fmt.Errorf("CNI ADD %s for pod %s: %w", list.Name, pod.ID, err)
	}
	if res != nil {
		cur, err := current.NewResultFromResult(res)
		if err == nil {
			for _, ip := range cur.IPs {
				att.IPs = append(att.IPs, ip.Address.IP.String())
			}
			sortIPv4First(att.IPs)
		}
		if b, err := json.Marshal(res); err == nil {
			att.Result = b
		}
	}
	return nil
}

// Detach runs CNI DEL with the config ADD used (from the checkpoint).
// DEL is idempotent by spec; a netns that is already gone is passed as is,
// and plugins still release IPs and rules.
func (n *Network) Detach(ctx context.Context, pod Pod, att *Attachment) error {
	var list *libcni.NetworkConfigList
	var err error
	if att != nil && len(att.ConfList) > 0 {
		list, err = libcni.ConfListFromBytes(att.ConfList)
	} else {
		list, _, err = n.Config()
	}
	if err != nil {
		return fmt.Errorf("CNI DEL config for pod %s: %w", pod.ID, err)
	}
	if err := n.del(ctx, list, runtimeConf(pod)); err != nil {
		return err
	}
	if netnsGone(pod.NetNSPath) {
		if err := removeOrphanRules(ctx, list.Name, pod.ID); err != nil {
			return fmt.Errorf("CNI DEL %s for pod %s: %w", list.Name, pod.ID, err)
		}
	}
	return nil
}

// del runs DEL over the list. libcni stops at the first plugin that
// fails; then every plugin is deleted on its own, in reverse order, so one
// broken or missing plugin never strands what the others allocated. A
// plugin that is not installed cannot have added anything and is skipped.
func (n *Network) del(ctx context.Context, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (retErr error) {
	ctx, span := tracing.Start(ctx, "cni.del", tracing.AttrPodID.String(rt.ContainerID))
	defer func() { tracing.End(span, retErr) }()
	err := n.cni.DelNetworkList(ctx, list, rt)
	if err == nil {
		return nil
	}
	n.log.Warn("CNI DEL failed; deleting plugin by plugin", "pod", rt.ContainerID, "network", list.Name, "err", err)
	var errs []error
	for i := len(list.Plugins) - 1; i >= 0; i-- {
		p := list.Plugins[i]
		if _, ferr := n.findPlugin(p.Network.Type); ferr != nil {
			continue
		}
		b, merr := json.Marshal(map[string]any{"cniVersion": list.CNIVersion, "name": list.Name, "plugins": []json.RawMessage{p.Bytes}})
		if merr != nil {
			errs = append(errs, merr)
			continue
		}
		one, perr := libcni.ConfListFromBytes(b)
		if perr != nil {
			errs = append(errs, perr)
			continue
		}
		if derr := n.cni.DelNetworkList(ctx, one, rt); derr != nil {
			errs = append(errs, fmt.Errorf("plugin %s: %w", p.Network.Type, derr))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("CNI DEL %s for pod %s: %w", list.Name, rt.ContainerID, errors.Join(errs...))
	}
	return nil
}

func sortIPv4First(ips []string) {
	sort.SliceStable(ips, func(i, j int) bool {
		return net.ParseIP(ips[i]).To4() != nil && net.ParseIP(ips[j]).To4() == nil
	})
}
