package cri

import (
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/liveconfig"
)

// runtimeHandlers lists each configured handler and, as containerd does,
// the default handler again under the name "" (what a sandbox without
// runtime_handler gets).
func (s *Service) runtimeHandlers() []*runtime.RuntimeHandler {
	live := s.live.Load()
	entry := func(name string, f liveconfig.Features) *runtime.RuntimeHandler {
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
