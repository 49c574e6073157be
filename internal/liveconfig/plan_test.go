package liveconfig

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/errdefs"
)

func validated(t *testing.T, edit func(*config.Config)) *config.Config {
	t.Helper()
	c := config.Default()
	c.RuntimeHandlers["crun"] = config.RuntimeHandler{Binary: "crun"}
	if edit != nil {
		edit(c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	return c
}

func nothingInUse(string) string { return "" }

func byKey(changes []Change) map[string]Change {
	out := map[string]Change{}
	for _, c := range changes {
		out[c.Key] = c
	}
	return out
}

func TestPlanNoChange(t *testing.T) {
	cur := validated(t, nil)
	eff, changes := Plan(cur, validated(t, nil), nothingInUse)
	if len(changes) != 0 {
		t.Fatalf("changes for an equal config: %+v", changes)
	}
	if !reflect.DeepEqual(eff, cur) {
		t.Fatalf("effective config differs:\n%+v\n%+v", eff, cur)
	}
}

func TestPlanAppliesLiveKeysAndKeepsTheRest(t *testing.T) {
	cur := validated(t, nil)
	next := validated(t, func(c *config.Config) {
		c.LogLevel = "warn"
		c.RegistryConfigDir = "/etc/other/certs.d"
		c.ImagePullProgressTimeout = config.Duration(5 * time.Second)
		c.Root = "/var/lib/elsewhere"
		c.NRI.Enable = false
		c.PinnedImages = []string{"registry.k8s.io/pause:3.10"}
	})
	eff, changes := Plan(cur, next, nothingInUse)
	got := byKey(changes)
	for _, k := range []string{"log_level", "registry_config_dir", "image_pull_progress_timeout"} {
		if c, ok := got[k]; !ok || !c.Applied {
			t.Errorf("%s: %+v, want applied", k, c)
		}
	}
	for _, k := range []string{"root", "nri.enable", "pinned_images"} {
		c, ok := got[k]
		if !ok || c.Applied || !strings.Contains(c.Reason, "restart") {
			t.Errorf("%s: %+v, want kept (restart)", k, c)
		}
	}
	if len(changes) != 6 {
		t.Errorf("%d changes, want 6: %+v", len(changes), changes)
	}
	if eff.LogLevel != "warn" || eff.RegistryConfigDir != "/etc/other/certs.d" || eff.ImagePullProgressTimeout != config.Duration(5*time.Second) {
		t.Errorf("live keys not applied: %+v", eff)
	}
	if eff.Root != cur.Root || !eff.NRI.Enable || len(eff.PinnedImages) != 0 {
		t.Errorf("restart keys changed: root %q nri %v pinned %v", eff.Root, eff.NRI.Enable, eff.PinnedImages)
	}
	if got["log_level"].Old != `"debug"` && got["log_level"].Old != `"info"` || got["log_level"].New != `"warn"` {
		t.Errorf("log_level rendering: %+v", got["log_level"])
	}
}

func TestPlanHandlers(t *testing.T) {
	cur := validated(t, func(c *config.Config) {
		c.RuntimeHandlers["kata"] = config.RuntimeHandler{Binary: "kata"}
		c.RuntimeHandlers["old"] = config.RuntimeHandler{Binary: "old"}
		c.RuntimeHandlers["tweak"] = config.RuntimeHandler{Binary: "runc", Options: []string{"--debug"}}
	})
	next := validated(t, func(c *config.Config) {
		delete(c.RuntimeHandlers, "crun")                                     // in use: kept
		delete(c.RuntimeHandlers, "old")                                      // unused: removed
		c.RuntimeHandlers["kata"] = config.RuntimeHandler{Binary: "kata-new"} // in use: kept
		c.RuntimeHandlers["tweak"] = config.RuntimeHandler{Binary: "runc"}    // unused: changed
		c.RuntimeHandlers["youki"] = config.RuntimeHandler{Binary: "youki", Options: []string{}}
	})
	inUse := func(h string) string {
		switch h {
		case "crun":
			return "pod 0123456789ab"
		case "kata":
			return "2 containers"
		}
		return ""
	}
	eff, changes := Plan(cur, next, inUse)
	got := byKey(changes)
	want := map[string]bool{
		"runtime_handlers.crun": false, "runtime_handlers.kata": false,
		"runtime_handlers.old": true, "runtime_handlers.tweak": true, "runtime_handlers.youki": true,
	}
	if len(changes) != len(want) {
		t.Fatalf("changes %+v, want keys %v", changes, want)
	}
	for k, applied := range want {
		c := got[k]
		if c.Applied != applied {
			t.Errorf("%s: %+v, want applied=%v", k, c, applied)
		}
		if !applied && !strings.Contains(c.Reason, "in use by") {
			t.Errorf("%s: reason %q does not say what uses it", k, c.Reason)
		}
	}
	if !strings.Contains(got["runtime_handlers.crun"].Reason, "pod 0123456789ab") || !strings.Contains(got["runtime_handlers.crun"].Reason, "removed") {
		t.Errorf("crun reason: %q", got["runtime_handlers.crun"].Reason)
	}
	if got["runtime_handlers.youki"].Old != "" {
		t.Errorf("added handler has an old value: %+v", got["runtime_handlers.youki"])
	}
	if _, ok := eff.RuntimeHandlers["crun"]; !ok {
		t.Error("in-use crun was removed")
	}
	if eff.RuntimeHandlers["kata"].Binary != "kata" {
		t.Errorf("in-use kata changed: %+v", eff.RuntimeHandlers["kata"])
	}
	if _, ok := eff.RuntimeHandlers["old"]; ok {
		t.Error("unused handler not removed")
	}
	if h := eff.RuntimeHandlers["tweak"]; len(h.Options) != 0 {
		t.Errorf("unused handler not changed: %+v", h)
	}
	if _, ok := eff.RuntimeHandlers["youki"]; !ok {
		t.Error("added handler missing")
	}
	if _, ok := cur.RuntimeHandlers["youki"]; ok {
		t.Error("Plan modified the running config")
	}
}

func TestPlanDefaultHandlerAndRuntime(t *testing.T) {
	cur := validated(t, nil) // runc derived from runtime = "runc"
	next := validated(t, func(c *config.Config) {
		c.Runtime = "/usr/local/bin/runc"
		c.DefaultRuntimeHandler = "crun"
	})
	// runc is no longer in next (default changed, runc was derived): in use, kept.
	eff, changes := Plan(cur, next, func(h string) string {
		if h == "runc" {
			return "pod 0123456789ab"
		}
		return ""
	})
	got := byKey(changes)
	if c := got["default_runtime_handler"]; !c.Applied || eff.DefaultRuntimeHandler != "crun" {
		t.Errorf("default_runtime_handler: %+v, effective %q", c, eff.DefaultRuntimeHandler)
	}
	if c := got["runtime_handlers.runc"]; c.Applied {
		t.Errorf("in-use runc removed: %+v", c)
	}
	// runtime only feeds the (new) default's entry, crun, which is
	// defined explicitly and unchanged: applies.
	if c := got["runtime"]; !c.Applied || eff.Runtime != "/usr/local/bin/runc" {
		t.Errorf("runtime: %+v", c)
	}

	// The default handler derived from runtime, in use: runtime is kept with it.
	next2 := validated(t, func(c *config.Config) { c.Runtime = "/usr/local/bin/runc" })
	eff, changes = Plan(cur, next2, func(h string) string {
		if h == "runc" {
			return "pod 0123456789ab"
		}
		return ""
	})
	got = byKey(changes)
	if c := got["runtime"]; c.Applied || eff.Runtime != "runc" || !strings.Contains(c.Reason, "runtime_handlers.runc") {
		t.Errorf("runtime with its handler in use: %+v, effective %q", c, eff.Runtime)
	}
	// Unused: both apply.
	eff, changes = Plan(cur, next2, nothingInUse)
	got = byKey(changes)
	if !got["runtime"].Applied || !got["runtime_handlers.runc"].Applied || eff.RuntimeHandlers["runc"].Binary != "/usr/local/bin/runc" {
		t.Errorf("unused default handler: %+v", changes)
	}

	// Records without a handler pin the default.
	_, changes = Plan(cur, next, func(h string) string {
		if h == "" {
			return "pod 0123456789ab"
		}
		return ""
	})
	if c := byKey(changes)["default_runtime_handler"]; c.Applied {
		t.Errorf("default changed under records without a handler: %+v", c)
	}
}

// clone must copy every slice and map, or a reload could change the
// snapshot in effect under a running request.
func TestCloneSharesNothing(t *testing.T) {
	c := validated(t, func(c *config.Config) {
		c.PinnedImages = []string{"a"}
		c.DefaultUlimits = []string{"nofile=1"}
		c.RuntimeHandlers["x"] = config.RuntimeHandler{Binary: "x", Options: []string{"--a"}}
	})
	out := clone(c)
	if !reflect.DeepEqual(out, c) {
		t.Fatal("clone differs")
	}
	v, w := reflect.ValueOf(c).Elem(), reflect.ValueOf(out).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		switch f.Type.Kind() {
		case reflect.Slice, reflect.Map:
			if v.Field(i).Len() > 0 && v.Field(i).UnsafePointer() == w.Field(i).UnsafePointer() {
				t.Errorf("clone shares %s", f.Name)
			}
		case reflect.Struct:
			for j := 0; j < f.Type.NumField(); j++ {
				if k := f.Type.Field(j).Type.Kind(); k == reflect.Slice || k == reflect.Map {
					t.Errorf("clone: %s.%s is a %s; copy it in clone", f.Name, f.Type.Field(j).Name, k)
				}
			}
		}
	}
	out.RuntimeHandlers["x"].Options[0] = "--b"
	if c.RuntimeHandlers["x"].Options[0] != "--a" {
		t.Error("clone shares a handler's options")
	}
}

func TestAdmitHandlerHoldsOffSwap(t *testing.T) {
	h := Static(validated(t, nil))
	if _, _, err := h.AdmitHandler("nope"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown handler: %v", err)
	}
	name, release, err := h.AdmitHandler("")
	if err != nil || name != "runc" {
		t.Fatalf("default handler: %q, %v", name, err)
	}
	var seen int
	if _, err := h.Swap(func(cur *Snapshot, starting func(string) int) (*Snapshot, error) {
		seen = starting("runc")
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if seen != 1 {
		t.Fatalf("starting(runc) = %d during an admission, want 1", seen)
	}
	release()
	release() // idempotent
	if _, err := h.Swap(func(cur *Snapshot, starting func(string) int) (*Snapshot, error) {
		seen = starting("runc")
		return NewSnapshot(cur.Generation+1, cur.Config, nil), nil
	}); err != nil {
		t.Fatal(err)
	}
	if seen != 0 || h.Load().Generation != 2 {
		t.Fatalf("after release: starting %d, generation %d", seen, h.Load().Generation)
	}
}

// A handler admitted by a starting pod stays in every snapshot published
// until the admission is released, however reloads race with it.
func TestAdmittedHandlerSurvivesRacingReloads(t *testing.T) {
	with := validated(t, func(c *config.Config) { c.RuntimeHandlers["x"] = config.RuntimeHandler{Binary: "x"} })
	without := validated(t, nil)
	h := NewHolder(NewSnapshot(1, with, nil))
	stop := make(chan struct{})
	done := make(chan struct{})
	var swaps atomic.Int64
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			swaps.Add(1)
			select {
			case <-stop:
				return
			default:
			}
			if _, err := h.Swap(func(cur *Snapshot, starting func(string) int) (*Snapshot, error) {
				next := with
				if i%2 == 0 {
					next = without
				}
				inUse := func(name string) string {
					if starting(name) > 0 {
						return "a pod starting"
					}
					return ""
				}
				eff, changes := Plan(cur.Config, next, inUse)
				if len(changes) == 0 {
					return nil, nil
				}
				return NewSnapshot(cur.Generation+1, eff, nil), nil
			}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	admitted := 0
	for admitted < 50 {
		name, release, err := h.AdmitHandler("x")
		if err != nil {
			runtime.Gosched()
			continue // removed meanwhile: refused, as a pod start would be
		}
		admitted++
		// Let at least two reloads (one of them a removal) run while
		// the handler is admitted.
		for start := swaps.Load(); swaps.Load() < start+3; {
			runtime.Gosched()
		}
		if _, ok := h.Load().Handler(name); !ok {
			t.Fatalf("handler %s removed while admitted (generation %d)", name, h.Load().Generation)
		}
		release()
	}
	close(stop)
	<-done
}
