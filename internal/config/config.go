// Package config holds berthd's configuration: embedded defaults, the TOML
// file, and command-line flags layered on top in that order.
package config

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/docker/go-units"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Default locations; every one has a TOML key and a flag.
const (
	DefaultListen            = "unix:///run/berth/berth.sock"
	DefaultRoot              = "/var/lib/berth"
	DefaultState             = "/run/berth"
	DefaultConfigPath        = "/etc/berth/berth.toml"
	DefaultRuntime           = "runc"
	DefaultCRIU              = "criu"
	DefaultCNIConfDir        = "/etc/cni/net.d"
	DefaultRegistryConfigDir = "/etc/berth/certs.d"
	DefaultStreamingAddress  = "127.0.0.1:0"
	DefaultLogLevel          = "info"
	DefaultLogFormat         = "text"
	DefaultCgroupParent      = "berth"
	DefaultRuntimeHandler    = "runc"
	DefaultSignaturePolicy   = "/etc/berth/policy.json"
)

// DefaultImagePullProgressTimeout cancels a pull that received nothing for
// this long (containerd's default is 5m; decision 1511 says why less).
const DefaultImagePullProgressTimeout = time.Minute

// The cgroup drivers (cgroup_driver).
const (
	CgroupDriverCgroupfs = "cgroupfs"
	CgroupDriverSystemd  = "systemd"
)

// DefaultCNIBinDirs are searched in order for CNI plugins: the upstream
// location first, then where Debian's containernetworking-plugins installs.
var DefaultCNIBinDirs = []string{"/opt/cni/bin", "/usr/lib/cni"}

// Config is berthd's effective configuration. The TOML keys are the names
// users write in berth.toml; `berthd config` prints this struct.
type Config struct {
	// Listen is the CRI endpoint, unix:///path.
	Listen string `toml:"listen" json:"listen"`
	// Root holds persistent state: images, container records.
	Root string `toml:"root" json:"root"`
	// State holds runtime state that dies with a reboot: netns pins, sockets.
	State string `toml:"state" json:"state"`
	// Runtime is the default OCI runtime binary (name in PATH or a path).
	Runtime string `toml:"runtime" json:"runtime"`
	// CRIU is the criu binary (name in PATH or a path) for checkpoint and
	// restore (docs/checkpoint.md).
	CRIU string `toml:"criu" json:"criu"`
	// DefaultRuntimeHandler names the handler used when a sandbox asks for none.
	DefaultRuntimeHandler string `toml:"default_runtime_handler" json:"default_runtime_handler"`
	// RuntimeHandlers maps CRI runtime_handler names to OCI runtimes.
	RuntimeHandlers map[string]RuntimeHandler `toml:"runtime_handlers" json:"runtime_handlers"`
	// CNIConfDir is watched for the first .conflist/.conf network config.
	CNIConfDir string `toml:"cni_conf_dir" json:"cni_conf_dir"`
	// CNIBinDirs are searched for CNI plugin binaries.
	CNIBinDirs []string `toml:"cni_bin_dirs" json:"cni_bin_dirs"`
	// RegistryConfigDir holds containerd-style <host>/hosts.toml files.
	RegistryConfigDir string `toml:"registry_config_dir" json:"registry_config_dir"`
	// SignaturePolicy is the image signature policy, a containers/image
	// policy.json (docs/signature-policy.md); an absent file or "" accepts
	// every image.
	SignaturePolicy string `toml:"signature_policy" json:"signature_policy"`
	// StreamingAddress is where exec/attach/port-forward are served.
	StreamingAddress string `toml:"streaming_address" json:"streaming_address"`
	// StreamingTLSCert and StreamingTLSKey, both set, serve the streaming
	// server over TLS (PEM files); both empty serve plain HTTP.
	StreamingTLSCert string `toml:"streaming_tls_cert" json:"streaming_tls_cert"`
	StreamingTLSKey  string `toml:"streaming_tls_key" json:"streaming_tls_key"`
	// MetricsAddress serves Prometheus metrics; empty turns them off.
	MetricsAddress string `toml:"metrics_address" json:"metrics_address"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `toml:"log_level" json:"log_level"`
	// LogFormat is text or json.
	LogFormat string `toml:"log_format" json:"log_format"`
	// CgroupDriver is cgroupfs or systemd (needs a running systemd);
	// empty is cgroupfs, which Validate writes in.
	CgroupDriver string `toml:"cgroup_driver" json:"cgroup_driver"`
	// CgroupParent is the parent of pod cgroups whose config names none.
	CgroupParent string `toml:"cgroup_parent" json:"cgroup_parent"`
	// PinnedImages are never garbage collected and report pinned=true.
	PinnedImages []string `toml:"pinned_images" json:"pinned_images"`
	// ImagePullProgressTimeout cancels a pull that received nothing from
	// the registry for this long; 0 turns the check off.
	ImagePullProgressTimeout Duration `toml:"image_pull_progress_timeout" json:"image_pull_progress_timeout"`
	// ImageRangeFetch fetches large layer blobs in parallel HTTP range
	// requests (decision 3000).
	ImageRangeFetch ImageRangeFetch `toml:"image_range_fetch" json:"image_range_fetch"`
	// ImageLazyPull serves eStargz layers before they have arrived
	// (decision 3600).
	ImageLazyPull ImageLazyPull `toml:"image_lazy_pull" json:"image_lazy_pull"`
	// ImageLimits bound what one image may make berthd unpack (decision
	// 3420): every image is hostile input.
	ImageLimits ImageLimits `toml:"image_limits" json:"image_limits"`
	// DefaultNetwork is the embedded CNI network used while CNIConfDir
	// holds no config.
	DefaultNetwork DefaultNetwork `toml:"default_network" json:"default_network"`
	// NRI is the Node Resource Interface: external plugins that see and
	// adjust pods and containers (docs/nri.md).
	NRI NRI `toml:"nri" json:"nri"`
	// DefaultUlimits are every container's rlimits, CRI-O's form
	// "nofile=1024:2048" (soft:hard; one value sets both; -1 unlimited).
	// None: containers inherit the runtime's, as in containerd.
	DefaultUlimits []string `toml:"default_ulimits" json:"default_ulimits"`
	// CDISpecDirs hold Container Device Interface specs, lowest priority
	// first (a later directory's device of the same name wins).
	CDISpecDirs []string `toml:"cdi_spec_dirs" json:"cdi_spec_dirs"`
	// Tracing exports OpenTelemetry spans of CRI requests over OTLP
	// (docs/tracing.md). Off by default; read at start only.
	Tracing Tracing `toml:"tracing" json:"tracing"`
}

// Tracing configures OpenTelemetry tracing.
type Tracing struct {
	// Enable turns span export on.
	Enable bool `toml:"enable" json:"enable"`
	// Endpoint is the OTLP collector: host:port (plain text) or a URL
	// (http:// or https://; for http/protobuf the path defaults to
	// /v1/traces).
	Endpoint string `toml:"endpoint" json:"endpoint"`
	// Protocol is "grpc" or "http/protobuf".
	Protocol string `toml:"protocol" json:"protocol"`
	// SamplingRate is the ratio of new traces sampled, 0 to 1; a caller's
	// sampled flag wins (parent-based).
	SamplingRate float64 `toml:"sampling_rate" json:"sampling_rate"`
	// ServiceName is the service.name resource attribute.
	ServiceName string `toml:"service_name" json:"service_name"`
}

// Tracing protocols and defaults.
const (
	TracingProtocolGRPC        = "grpc"
	TracingProtocolHTTP        = "http/protobuf"
	DefaultTracingEndpoint     = "127.0.0.1:4317"
	DefaultTracingServiceName  = "berth"
	DefaultTracingSamplingRate = 1.0
)

// DefaultCDISpecDirs are the CDI specification's (and containerd's and
// CRI-O's) spec directories: static, then generated at run time.
var DefaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// Rlimits turns DefaultUlimits into OCI rlimits (RLIMIT_NOFILE …).
func (c *Config) Rlimits() ([]specs.POSIXRlimit, error) {
	var out []specs.POSIXRlimit
	seen := map[string]bool{}
	for _, v := range c.DefaultUlimits {
		u, err := units.ParseUlimit(v)
		if err != nil {
			return nil, fmt.Errorf("default_ulimits %q: %v", v, err)
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("default_ulimits: %s given twice", u.Name)
		}
		seen[u.Name] = true
		// -1 is unlimited: RLIM_INFINITY, all ones.
		out = append(out, specs.POSIXRlimit{Type: "RLIMIT_" + strings.ToUpper(u.Name), Soft: uint64(u.Soft), Hard: uint64(u.Hard)})
	}
	return out, nil
}

// NRI configures the Node Resource Interface, with containerd 2.x's names
// and defaults.
type NRI struct {
	// Enable turns NRI on.
	Enable bool `toml:"enable" json:"enable"`
	// SocketPath is where external plugins connect.
	SocketPath string `toml:"socket_path" json:"socket_path"`
	// PluginPath holds pre-installed plugins berthd starts itself.
	PluginPath string `toml:"plugin_path" json:"plugin_path"`
	// PluginConfigPath holds the configuration of those plugins.
	PluginConfigPath string `toml:"plugin_config_path" json:"plugin_config_path"`
	// PluginRegistrationTimeout bounds a plugin's registration.
	PluginRegistrationTimeout Duration `toml:"plugin_registration_timeout" json:"plugin_registration_timeout"`
	// PluginRequestTimeout bounds each request to a plugin.
	PluginRequestTimeout Duration `toml:"plugin_request_timeout" json:"plugin_request_timeout"`
}

// Defaults of the NRI table (containerd 2.x's).
const (
	DefaultNRISocketPath                = "/var/run/nri/nri.sock"
	DefaultNRIPluginPath                = "/opt/nri/plugins"
	DefaultNRIPluginConfigPath          = "/etc/nri/conf.d"
	DefaultNRIPluginRegistrationTimeout = 5 * time.Second
	DefaultNRIPluginRequestTimeout      = 2 * time.Second
)

// Duration is a time.Duration written as "2s" in berth.toml.
type Duration time.Duration

// MarshalText writes the Go duration form.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads the Go duration form ("2s", "500ms").
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// ImageLazyPull configures lazy pulling of eStargz layers.
type ImageLazyPull struct {
	// Enable mounts a layer whose manifest names its eStargz TOC
	// before it has arrived; off, every layer is pulled whole.
	Enable bool `toml:"enable" json:"enable"`
	// BackgroundFetchQuiet is how long the node's lazy layers must have
	// had no read from a registry before a lazy layer's background fetch
	// starts (30 s after its pull at the latest); 0 starts it at once.
	BackgroundFetchQuiet Duration `toml:"background_fetch_quiet" json:"background_fetch_quiet"`
}

// DefaultLazyBackgroundFetchQuiet leaves a container starting on a
// lazily pulled image its first seconds of reads without the image's
// background fetch beside them (decision 3600).
const DefaultLazyBackgroundFetchQuiet = 2 * time.Second

// maxLazyBackgroundFetchQuiet bounds the setting: past the 30 s limit of
// the wait it would change nothing.
const maxLazyBackgroundFetchQuiet = 30 * time.Second

// ImageRangeFetch configures parallel range requests within one layer.
type ImageRangeFetch struct {
	// Enable turns range requests on (for registries that serve them).
	Enable bool `toml:"enable" json:"enable"`
	// MinLayerSize is the smallest layer blob fetched in ranges.
	MinLayerSize ByteSize `toml:"min_layer_size" json:"min_layer_size"`
	// ChunkSize is the size of one range request.
	ChunkSize ByteSize `toml:"chunk_size" json:"chunk_size"`
	// Parallel is how many ranges of one layer are in flight at once.
	Parallel int `toml:"parallel" json:"parallel"`
	// Retries is how often a range whose connection broke is asked for
	// again, from its last byte received.
	Retries int `toml:"retries" json:"retries"`
}

// Defaults of [image_range_fetch].
const (
	DefaultImageRangeMinLayerSize = 64 << 20
	DefaultImageRangeChunkSize    = 32 << 20
	DefaultImageRangeParallel     = 4
	DefaultImageRangeRetries      = 5
)

// ByteSize is a size in bytes written as "32MiB" (or a plain number) in
// berth.toml.
type ByteSize int64

// MarshalText writes the largest binary unit that divides the size
// ("32MiB"), else the number of bytes.
func (b ByteSize) MarshalText() ([]byte, error) {
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.size == 0 {
			return []byte(fmt.Sprintf("%d%s", int64(b)/u.size, u.name)), nil
		}
	}
	return []byte(fmt.Sprint(int64(b))), nil
}

// UnmarshalText reads "32MiB", "64MB" (also binary: docker's units) or a
// plain number of bytes.
func (b *ByteSize) UnmarshalText(t []byte) error {
	v, err := units.RAMInBytes(string(t))
	if err != nil {
		return err
	}
	*b = ByteSize(v)
	return nil
}

func (r ImageRangeFetch) validate() error {
	if !r.Enable {
		return nil
	}
	if r.MinLayerSize <= 0 || r.ChunkSize <= 0 {
		return fmt.Errorf("image_range_fetch: min_layer_size and chunk_size must be positive")
	}
	if r.Parallel < 1 || r.Parallel > 64 {
		return fmt.Errorf("image_range_fetch.parallel %d: want 1 to 64", r.Parallel)
	}
	if r.Retries < 0 {
		return fmt.Errorf("image_range_fetch.retries must not be negative")
	}
	return nil
}

// ImageLimits bound one image's layers, in bytes and entries, for pulls and
// imports alike. A limit of 0 turns that check off.
type ImageLimits struct {
	// MaxLayerSize bounds one layer's uncompressed tar stream and the sum
	// of the apparent sizes of its files (a sparse file counts at its
	// full size).
	MaxLayerSize ByteSize `toml:"max_layer_size" json:"max_layer_size"`
	// MaxImageSize bounds the sum of the apparent sizes of the files of
	// all the layers one pull or import unpacks.
	MaxImageSize ByteSize `toml:"max_image_size" json:"max_image_size"`
	// MaxLayerEntries bounds the tar entries of one layer.
	MaxLayerEntries int64 `toml:"max_layer_entries" json:"max_layer_entries"`
	// MaxLayerDirs bounds the directories of one layer (berthd keeps a
	// record of each until the layer is done).
	MaxLayerDirs int64 `toml:"max_layer_dirs" json:"max_layer_dirs"`
}

// Defaults of [image_limits]: far above any image seen in practice (the
// largest machine-learning images hold layers of a few GiB and a few
// hundred thousand files), far below what fills a node.
const (
	DefaultImageMaxLayerSize    = 32 << 30
	DefaultImageMaxImageSize    = 64 << 30
	DefaultImageMaxLayerEntries = 1 << 22
	DefaultImageMaxLayerDirs    = 1 << 20
)

func (l ImageLimits) validate() error {
	if l.MaxLayerSize < 0 || l.MaxImageSize < 0 || l.MaxLayerEntries < 0 || l.MaxLayerDirs < 0 {
		return fmt.Errorf("image_limits: limits must not be negative (0 turns one off)")
	}
	return nil
}

// DefaultNetwork shapes the embedded bridge network. Two daemons on one
// node must not share a bridge or subnet, so both are configurable.
type DefaultNetwork struct {
	// Bridge is the Linux bridge name (at most 15 bytes).
	Bridge string `toml:"bridge" json:"bridge"`
	// Subnet is the host-local IPAM range, CIDR.
	Subnet string `toml:"subnet" json:"subnet"`
}

// Defaults of the embedded network.
const (
	DefaultNetworkBridge = "berth0"
	DefaultNetworkSubnet = "10.88.0.0/16"
)

// RuntimeHandler is one OCI runtime a sandbox can select by name.
type RuntimeHandler struct {
	// Binary is the runtime executable, a name in PATH or a path.
	Binary string `toml:"binary" json:"binary"`
	// Root is the runtime's --root; empty puts it under berth's state dir.
	Root string `toml:"root" json:"root"`
	// Options are extra global arguments passed before the subcommand.
	Options []string `toml:"options" json:"options"`
	// OCIVersion, when set, is the ociVersion written into this runtime's
	// bundles instead of the runtime-spec version berth is built with:
	// older runtimes refuse versions they do not know (Debian bookworm's
	// crun 1.8.1: "unknown version specified" for 1.3.0; "1.0.2" works).
	OCIVersion string `toml:"oci_version" json:"oci_version"`
}

// Default returns the embedded defaults.
func Default() *Config {
	return &Config{
		Listen:                DefaultListen,
		Root:                  DefaultRoot,
		State:                 DefaultState,
		Runtime:               DefaultRuntime,
		CRIU:                  DefaultCRIU,
		DefaultRuntimeHandler: DefaultRuntimeHandler,
		RuntimeHandlers:       map[string]RuntimeHandler{},
		CNIConfDir:            DefaultCNIConfDir,
		CNIBinDirs:            append([]string(nil), DefaultCNIBinDirs...),
		RegistryConfigDir:     DefaultRegistryConfigDir,
		SignaturePolicy:       DefaultSignaturePolicy,
		StreamingAddress:      DefaultStreamingAddress,
		MetricsAddress:        "",
		LogLevel:              DefaultLogLevel,
		LogFormat:             DefaultLogFormat,
		CgroupDriver:          "",
		CgroupParent:          DefaultCgroupParent,
		PinnedImages:          []string{},
		DefaultUlimits:        []string{},
		CDISpecDirs:           append([]string(nil), DefaultCDISpecDirs...),
		DefaultNetwork:        DefaultNetwork{Bridge: DefaultNetworkBridge, Subnet: DefaultNetworkSubnet},
		NRI: NRI{
			Enable: true, SocketPath: DefaultNRISocketPath,
			PluginPath: DefaultNRIPluginPath, PluginConfigPath: DefaultNRIPluginConfigPath,
			PluginRegistrationTimeout: Duration(DefaultNRIPluginRegistrationTimeout),
			PluginRequestTimeout:      Duration(DefaultNRIPluginRequestTimeout),
		},

		ImagePullProgressTimeout: Duration(DefaultImagePullProgressTimeout),
		// On: lazy layers are held by the node's keeper and outlive
		// berthd and their server (decision 3600); only layers whose
		// manifest names an eStargz TOC are served lazily.
		ImageLazyPull: ImageLazyPull{Enable: true, BackgroundFetchQuiet: Duration(DefaultLazyBackgroundFetchQuiet)},
		ImageRangeFetch: ImageRangeFetch{
			Enable: true, MinLayerSize: DefaultImageRangeMinLayerSize, ChunkSize: DefaultImageRangeChunkSize,
			Parallel: DefaultImageRangeParallel, Retries: DefaultImageRangeRetries,
		},
		ImageLimits: ImageLimits{
			MaxLayerSize: DefaultImageMaxLayerSize, MaxImageSize: DefaultImageMaxImageSize,
			MaxLayerEntries: DefaultImageMaxLayerEntries, MaxLayerDirs: DefaultImageMaxLayerDirs,
		},
		Tracing: Tracing{
			Endpoint: DefaultTracingEndpoint, Protocol: TracingProtocolGRPC,
			SamplingRate: DefaultTracingSamplingRate, ServiceName: DefaultTracingServiceName,
		},
	}
}

// LoadFile reads a TOML file over cfg. A missing file is not an error: the
// defaults stand. Unknown keys are errors so that typos do not pass silently.
func LoadFile(cfg *Config, path string) error {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read config %s: %w", path, err)
	}
	md, err := toml.Decode(string(data), cfg)
	if err != nil {
		return fmt.Errorf("parse config %s: %w", path, err)
	}
	if undec := md.Undecoded(); len(undec) > 0 {
		keys := make([]string, len(undec))
		for i, k := range undec {
			keys[i] = k.String()
		}
		return fmt.Errorf("config %s: unknown keys: %s", path, strings.Join(keys, ", "))
	}
	return nil
}

// EffectiveCgroupDriver is the cgroup driver cgroup_driver names: an
// explicit choice, otherwise cgroupfs. Validate writes it into the field,
// so that the daemon and RuntimeConfig read the field as it is. Not
// detected: switching to systemd by itself would change how pod cgroup
// parents must be spelled under a kubelet set up for cgroupfs (the
// kubelet reads the driver through RuntimeConfig).
func (c *Config) EffectiveCgroupDriver() string {
	if c.CgroupDriver == "" {
		return CgroupDriverCgroupfs
	}
	return c.CgroupDriver
}

// Validate checks the values and fills derived defaults (the runc handler).
func (c *Config) Validate() error {
	if !strings.HasPrefix(c.Listen, "unix://") || len(c.Listen) <= len("unix://") {
		return fmt.Errorf("listen %q: only unix:///path endpoints are supported", c.Listen)
	}
	for name, dir := range map[string]string{"root": c.Root, "state": c.State} {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("%s %q must be an absolute path", name, dir)
		}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("log_format %q: want text or json", c.LogFormat)
	}
	switch c.CgroupDriver = c.EffectiveCgroupDriver(); c.CgroupDriver {
	case CgroupDriverCgroupfs, CgroupDriverSystemd:
	default:
		return fmt.Errorf("cgroup_driver %q: want cgroupfs or systemd", c.CgroupDriver)
	}
	if (c.StreamingTLSCert == "") != (c.StreamingTLSKey == "") {
		return fmt.Errorf("streaming_tls_cert and streaming_tls_key must be set together")
	}
	if c.Runtime == "" {
		return fmt.Errorf("runtime must name an OCI runtime binary")
	}
	if err := c.Tracing.validate(); err != nil {
		return err
	}
	if c.RuntimeHandlers == nil {
		c.RuntimeHandlers = map[string]RuntimeHandler{}
	}
	if c.DefaultRuntimeHandler == "" {
		c.DefaultRuntimeHandler = DefaultRuntimeHandler
	}
	if _, ok := c.RuntimeHandlers[c.DefaultRuntimeHandler]; !ok {
		c.RuntimeHandlers[c.DefaultRuntimeHandler] = RuntimeHandler{Binary: c.Runtime}
	}
	for name, h := range c.RuntimeHandlers {
		if h.Binary == "" {
			return fmt.Errorf("runtime_handlers.%s: binary is required", name)
		}
	}
	if c.CNIBinDirs == nil {
		c.CNIBinDirs = []string{}
	}
	if c.DefaultNetwork.Bridge == "" {
		c.DefaultNetwork.Bridge = DefaultNetworkBridge
	}
	if len(c.DefaultNetwork.Bridge) > 15 {
		return fmt.Errorf("default_network.bridge %q: longer than 15 bytes", c.DefaultNetwork.Bridge)
	}
	if c.DefaultNetwork.Subnet == "" {
		c.DefaultNetwork.Subnet = DefaultNetworkSubnet
	}
	if _, _, err := net.ParseCIDR(c.DefaultNetwork.Subnet); err != nil {
		return fmt.Errorf("default_network.subnet %q: %v", c.DefaultNetwork.Subnet, err)
	}
	if c.PinnedImages == nil {
		c.PinnedImages = []string{}
	}
	if c.SignaturePolicy != "" && !filepath.IsAbs(c.SignaturePolicy) {
		return fmt.Errorf("signature_policy %q must be an absolute path (or empty: no policy)", c.SignaturePolicy)
	}
	if c.ImagePullProgressTimeout < 0 {
		return fmt.Errorf("image_pull_progress_timeout must not be negative")
	}
	if err := c.ImageRangeFetch.validate(); err != nil {
		return err
	}
	if q := time.Duration(c.ImageLazyPull.BackgroundFetchQuiet); q < 0 || q > maxLazyBackgroundFetchQuiet {
		return fmt.Errorf("image_lazy_pull.background_fetch_quiet %v must be between 0 and %v", q, maxLazyBackgroundFetchQuiet)
	}
	if err := c.ImageLimits.validate(); err != nil {
		return err
	}
	if c.NRI.Enable && !filepath.IsAbs(c.NRI.SocketPath) {
		return fmt.Errorf("nri.socket_path %q must be an absolute path", c.NRI.SocketPath)
	}
	if c.NRI.PluginRegistrationTimeout < 0 || c.NRI.PluginRequestTimeout < 0 {
		return fmt.Errorf("nri plugin timeouts must not be negative")
	}
	if c.DefaultUlimits == nil {
		c.DefaultUlimits = []string{}
	}
	if c.CDISpecDirs == nil {
		c.CDISpecDirs = []string{}
	}
	for _, d := range c.CDISpecDirs {
		if !filepath.IsAbs(d) {
			return fmt.Errorf("cdi_spec_dirs: %q is not an absolute path", d)
		}
	}
	if _, err := c.Rlimits(); err != nil {
		return err
	}
	return nil
}

// SocketPath returns the filesystem path of the unix listen endpoint.
func (c *Config) SocketPath() string {
	return strings.TrimPrefix(c.Listen, "unix://")
}

// TOML renders the configuration as berth.toml text.
func (c *Config) TOML() ([]byte, error) {
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf)
	enc.Indent = "  "
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	return buf.Bytes(), nil
}

func (t *Tracing) validate() error {
	if t.Protocol == "" {
		t.Protocol = TracingProtocolGRPC
	}
	if t.ServiceName == "" {
		t.ServiceName = DefaultTracingServiceName
	}
	if t.Endpoint == "" {
		t.Endpoint = DefaultTracingEndpoint
	}
	switch t.Protocol {
	case TracingProtocolGRPC, TracingProtocolHTTP:
	default:
		return fmt.Errorf("tracing.protocol %q: want %s or %s", t.Protocol, TracingProtocolGRPC, TracingProtocolHTTP)
	}
	if t.SamplingRate < 0 || t.SamplingRate > 1 || t.SamplingRate != t.SamplingRate {
		return fmt.Errorf("tracing.sampling_rate %v: want a ratio from 0 to 1", t.SamplingRate)
	}
	return nil
}

// StreamingInsecure reports whether the streaming server is reachable
// beyond this host without TLS: exec, attach and port-forward URLs are
// bearer tokens, and anyone on the network who sees or guesses one gets
// a shell in the container. berthd warns at start and berthctl doctor
// warns about it.
func (c *Config) StreamingInsecure() bool {
	return c.StreamingTLSCert == "" && BeyondLoopback(c.StreamingAddress)
}

// BeyondLoopback reports whether a host:port listens on more than the
// loopback interface: an empty host or an unspecified address (all
// interfaces), any address that is not loopback, and any host name but
// localhost (which is not resolved here).
func BeyondLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}
