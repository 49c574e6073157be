// Package liveconfig holds the part of berthd's configuration that may
// change while it runs (SIGHUP, docs/configuration.md#live-reload): an
// immutable Snapshot that a Holder swaps atomically. Components keep the
// Holder in a field and load the snapshot once per request, so a request
// (a pull, a pod start) runs to its end on the configuration it started
// with and never sees half of a reload
// (docs/decisions/2300-live-config-snapshot.md).
package liveconfig

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/sigpolicy"
)

// Features are what one runtime handler can do, probed once when the
// handler appears (at start or at the reload that adds it) with
// `<binary> features`, rather than on every call.
type Features struct {
	// RecursiveReadOnly: the runtime takes the "rro" mount option.
	RecursiveReadOnly bool
	// UserNamespaces: the runtime lists the user namespace and the node
	// can run user namespace pods.
	UserNamespaces bool
}

// Handler is one runtime handler as it is in effect.
type Handler struct {
	Name   string
	Config config.RuntimeHandler
	// Runtime runs the handler's OCI runtime; nil where no component
	// needs it (tests of the CRI layer alone).
	Runtime  *oci.Runtime
	Features Features
}

// Snapshot is one generation of the configuration in effect. Nothing in
// it is ever modified once it is published: a reload builds a new one.
type Snapshot struct {
	// Generation is 1 at start and grows by one with each reload that
	// changed something.
	Generation uint64
	// Config is the whole effective configuration: the keys a reload
	// applied and, for the others, what berthd started with. Read only.
	Config *config.Config
	// SignaturePolicy is the policy read from Config.SignaturePolicy when
	// the snapshot was made (at start, or by the reload that made it);
	// nil: no policy file, every image is accepted. Set it before the
	// snapshot is published.
	SignaturePolicy *sigpolicy.Policy
	// handlers are Config.RuntimeHandlers with their runtimes and features.
	handlers map[string]*Handler
}

// NewSnapshot builds a snapshot. handlers must hold exactly the entries of
// cfg.RuntimeHandlers; missing ones are filled from the config without a
// runtime or features.
func NewSnapshot(gen uint64, cfg *config.Config, handlers map[string]*Handler) *Snapshot {
	hs := make(map[string]*Handler, len(cfg.RuntimeHandlers))
	for name, hc := range cfg.RuntimeHandlers {
		if h, ok := handlers[name]; ok {
			hs[name] = h
			continue
		}
		hs[name] = &Handler{Name: name, Config: hc}
	}
	return &Snapshot{Generation: gen, Config: cfg, handlers: hs}
}

// Handler finds a runtime handler by name; "" is the default handler.
func (s *Snapshot) Handler(name string) (*Handler, bool) {
	_, h, ok := s.ResolveHandler(name)
	return h, ok
}

// ResolveHandler is Handler that also returns the name it looked up ("" is
// the default handler's), for messages about a handler that is missing.
func (s *Snapshot) ResolveHandler(name string) (string, *Handler, bool) {
	if name == "" {
		name = s.Config.DefaultRuntimeHandler
	}
	h, ok := s.handlers[name]
	return name, h, ok
}

// HandlerNames lists the handlers in effect, sorted.
func (s *Snapshot) HandlerNames() []string {
	names := make([]string, 0, len(s.handlers))
	for name := range s.handlers {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// ImageSignaturePolicy is the policy pulls check images against, nil for
// none (as an interface: a nil *sigpolicy.Policy is no policy).
func (s *Snapshot) ImageSignaturePolicy() image.SignaturePolicy {
	if s.SignaturePolicy == nil {
		return nil
	}
	return s.SignaturePolicy
}

// PullProgressTimeout is image_pull_progress_timeout.
func (s *Snapshot) PullProgressTimeout() time.Duration {
	return time.Duration(s.Config.ImagePullProgressTimeout)
}

// Holder publishes the snapshot in effect. Loads are lock-free; a reload
// (Swap) and the admission of a runtime handler by a starting pod
// (AdmitHandler) exclude each other, so that a reload never removes or
// changes a handler that a pod is being started with.
type Holder struct {
	cur atomic.Pointer[Snapshot]

	mu sync.Mutex
	// admitting counts, by handler, pods being started now.
	admitting map[string]int
}

// NewHolder publishes the first snapshot.
func NewHolder(s *Snapshot) *Holder {
	h := &Holder{admitting: map[string]int{}}
	h.cur.Store(s)
	return h
}

// Static is a Holder for one configuration that never reloads (tests and
// tools), with handlers taken from cfg.
func Static(cfg *config.Config) *Holder {
	return NewHolder(NewSnapshot(1, cfg, nil))
}

// Load returns the snapshot in effect. Keep it for the whole request.
func (h *Holder) Load() *Snapshot { return h.cur.Load() }

// AdmitHandler resolves a pod's runtime handler ("" is the default) in the
// snapshot in effect and keeps a reload from removing or changing it
// until release is called, by when the pod is either recorded (and so in
// use) or gone. An unknown handler is InvalidArgument.
func (h *Holder) AdmitHandler(name string) (resolved string, release func(), err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.cur.Load()
	name, _, ok := s.ResolveHandler(name)
	if !ok {
		return "", nil, fmt.Errorf("runtime handler %q is not configured (runtime_handlers has %v): %w", name, s.HandlerNames(), errdefs.ErrInvalidArgument)
	}
	h.admitting[name]++
	var once sync.Once
	return name, func() {
		once.Do(func() {
			h.mu.Lock()
			if h.admitting[name]--; h.admitting[name] <= 0 {
				delete(h.admitting, name)
			}
			h.mu.Unlock()
		})
	}, nil
}

// Swap publishes the snapshot fn builds from the one in effect. starting
// reports how many pods are being started with a handler now; no pod is
// admitted while fn runs. An error from fn publishes nothing.
func (h *Holder) Swap(fn func(cur *Snapshot, starting func(handler string) int) (*Snapshot, error)) (*Snapshot, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	next, err := fn(h.cur.Load(), func(handler string) int { return h.admitting[handler] })
	if err != nil {
		return nil, err
	}
	if next != nil {
		h.cur.Store(next)
	}
	return h.cur.Load(), nil
}
