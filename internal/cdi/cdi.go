// Package cdi resolves Container Device Interface (CDI) devices — the
// names DRA drivers and device plugins hand the kubelet, which passes them
// in ContainerConfig.CDI_devices or as "cdi.k8s.io/..." annotations — into
// edits of a container's OCI spec (device nodes, mounts, env, hooks),
// with the CDI project's own library, from the spec directories of the
// config (cdi_spec_dirs). docs/devices.md.
package cdi

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/berthcri/berth/internal/errdefs"
)

// Registry reads CDI specs from its directories and injects devices.
type Registry struct {
	cache *cdilib.Cache
	log   *slog.Logger
}

// New makes a registry over dirs (lowest priority first). It watches
// nothing: every injection rescans the directories, because a DRA driver
// writes a claim's spec just before the kubelet creates the container, and
// a scan of a few small files costs less than a watcher goroutine per
// daemon that could miss it.
func New(dirs []string, log *slog.Logger) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cache, _ := cdilib.NewCache(cdilib.WithSpecDirs(dirs...), cdilib.WithAutoRefresh(false)) // never fails
	return &Registry{cache: cache, log: log}
}

// Requested lists the CDI devices a container asks for: CDI_devices, then
// the devices of "cdi.k8s.io/" annotations (sorted by key), each once. A
// name that is not a fully qualified CDI name (vendor.com/class=name) is
// InvalidArgument.
func Requested(cfg *runtime.ContainerConfig) ([]string, error) {
	var out []string
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, d := range cfg.GetCDIDevices() {
		if _, _, _, err := parser.ParseQualifiedName(d.GetName()); err != nil {
			return nil, fmt.Errorf("CDI device %q: %v: %w", d.GetName(), err, errdefs.ErrInvalidArgument)
		}
		add(d.GetName())
	}
	// ParseAnnotations validates the names; its keys come from a map,
	// so they are sorted for a stable order.
	keys, _, err := cdilib.ParseAnnotations(cfg.GetAnnotations())
	if err != nil {
		return nil, fmt.Errorf("CDI annotations: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, d := range strings.Split(cfg.GetAnnotations()[k], ",") {
			add(d)
		}
	}
	return out, nil
}

// Inject applies the edits of devices (fully qualified names) to spec. A
// device no spec defines is NotFound, naming it and the directories read;
// specs that fail to parse are logged and skipped, as in containerd.
func (r *Registry) Inject(spec *specs.Spec, devices []string) error {
	if len(devices) == 0 {
		return nil
	}
	if err := r.cache.Refresh(); err != nil {
		r.log.Warn("CDI specs with errors were skipped", "dirs", r.cache.GetSpecDirectories(), "err", err)
	}
	unresolved, err := r.cache.InjectDevices(spec, devices...)
	if len(unresolved) > 0 {
		return fmt.Errorf("CDI devices %s: no spec in %s defines them: %w",
			strings.Join(unresolved, ", "), strings.Join(r.cache.GetSpecDirectories(), ", "), errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("CDI devices %s: %w", strings.Join(devices, ", "), err)
	}
	return nil
}
