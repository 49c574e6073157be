package cri

import (
	"context"
	"log/slog"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/oci"
)

// HandlerFeatures are what one runtime handler can do, probed once when
// the handler appears (`<binary> features`) rather than on every call.
type HandlerFeatures = liveconfig.Features

// ProbeRuntimeFeatures asks each handler's runtime for its features. A
// runtime that cannot answer (too old, missing) gets none, with a warning:
// its containers then refuse recursive read-only mounts. usernsErr is
// why the node cannot run user namespace pods (nil: it can); then no
// handler offers them.
func ProbeRuntimeFeatures(ctx context.Context, runtimes map[string]*oci.Runtime, usernsErr error, log *slog.Logger) map[string]HandlerFeatures {
	out := make(map[string]HandlerFeatures, len(runtimes))
	for name, rt := range runtimes {
		f, err := rt.Features(ctx)
		if err != nil {
			log.Warn("runtime features probe failed; assuming none", "handler", name, "binary", rt.Binary, "err", err)
		}
		out[name] = HandlerFeatures{RecursiveReadOnly: f.RecursiveReadOnly(), UserNamespaces: usernsErr == nil && f.UserNamespaces()}
	}
	return out
}

// runtimeHandlers lists each configured handler and, as containerd does,
// the default handler again under the name "" (what a sandbox without
// runtime_handler gets).
func (s *Service) runtimeHandlers() []*runtime.RuntimeHandler {
	live := s.live.Load()
	entry := func(name string, f HandlerFeatures) *runtime.RuntimeHandler {
		return &runtime.RuntimeHandler{Name: name, Features: &runtime.RuntimeHandlerFeatures{
			RecursiveReadOnlyMounts: f.RecursiveReadOnly,
			UserNamespaces:          f.UserNamespaces,
		}}
	}
	var out []*runtime.RuntimeHandler
	if h, ok := live.Handler(""); ok {
		out = append(out, entry("", h.Features))
	}
	for _, name := range live.HandlerNames() {
		h, _ := live.Handler(name)
		out = append(out, entry(name, h.Features))
	}
	return out
}
