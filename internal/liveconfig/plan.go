package liveconfig

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/berthcri/berth/internal/config"
)

// Change is one key that differs between the configuration in effect and
// the file a reload read.
type Change struct {
	// Key is the TOML key: log_level, nri.enable, runtime_handlers.crun.
	Key string
	// Old is the value in effect before the reload, New the file's, both
	// as JSON ("" for a handler that did not exist).
	Old, New string
	// Applied tells whether the reload put New in effect.
	Applied bool
	// Reason says why not, when not applied.
	Reason string
}

// InUse describes what uses a runtime handler ("pod 0123456789ab, 2
// containers"), or returns "" when nothing does. handler "" asks about
// records that name no handler (they run on the default handler).
type InUse func(handler string) string

// liveKeys are the scalar keys a reload applies as they are, each with
// how to copy it from the new file into the effective configuration.
// The components read them from the snapshot at the start of each request.
// signature_policy is the policy file's path; the policy itself is read
// by the reload into the snapshot (Snapshot.SignaturePolicy), and the
// image store takes it once per pull with the two registry keys
// (image.PullSettings), so a policy tightened by SIGHUP applies from the
// next pull on and a pull in flight finishes under the one it started with.
var liveKeys = map[string]func(eff, next *config.Config){
	"log_level":                   func(eff, next *config.Config) { eff.LogLevel = next.LogLevel },
	"registry_config_dir":         func(eff, next *config.Config) { eff.RegistryConfigDir = next.RegistryConfigDir },
	"image_pull_progress_timeout": func(eff, next *config.Config) { eff.ImagePullProgressTimeout = next.ImagePullProgressTimeout },
	"signature_policy":            func(eff, next *config.Config) { eff.SignaturePolicy = next.SignaturePolicy },
}

// LiveKeys lists the keys a reload may apply, sorted; runtime_handlers.*
// entries follow their own rules (Plan).
func LiveKeys() []string {
	keys := []string{"default_runtime_handler", "runtime", "runtime_handlers.<name>"}
	for k := range liveKeys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Plan compares the configuration in effect (cur) with a newly loaded and
// validated one (next) and returns the configuration a reload puts in
// effect, a new value that shares nothing with cur, with one Change per
// key that differs, sorted by key:
//
//   - log_level, registry_config_dir, image_pull_progress_timeout,
//     signature_policy apply;
//   - a runtime handler that is added applies; one removed or changed
//     applies only when nothing uses it (inUse), else it is kept as it
//     is, since the containers it runs need the same runtime and --root
//     to be stopped and removed;
//   - default_runtime_handler applies unless records without a handler
//     (which run on the default one) exist;
//   - runtime applies when the default handler it defines does (it only
//     serves as that handler's binary when runtime_handlers has no entry);
//   - every other key is read only at start: kept, needs a restart.
func Plan(cur, next *config.Config, inUse InUse) (*config.Config, []Change) {
	eff := clone(cur)
	curKeys, nextKeys := flatten(cur), flatten(next)
	var changes []Change
	for _, key := range unionKeys(curKeys, nextKeys) {
		o, n := curKeys[key], nextKeys[key]
		if o == n {
			continue
		}
		c := Change{Key: key, Old: o, New: n}
		switch apply, ok := liveKeys[key]; {
		case ok:
			apply(eff, next)
			c.Applied = true
		case key == "runtime", key == "default_runtime_handler":
			// Decided after the handlers, below.
			continue
		case strings.HasPrefix(key, "runtime_handlers."):
			c = planHandler(eff, next, strings.TrimPrefix(key, "runtime_handlers."), c, inUse)
		default:
			c.Reason = "read only at start: needs a restart"
		}
		changes = append(changes, c)
	}
	if next.DefaultRuntimeHandler != cur.DefaultRuntimeHandler {
		c := Change{Key: "default_runtime_handler", Old: quote(cur.DefaultRuntimeHandler), New: quote(next.DefaultRuntimeHandler)}
		if why := inUse(""); why != "" {
			c.Reason = "records without a runtime handler run on the default one (" + why + "); kept until they are removed"
		} else if _, ok := eff.RuntimeHandlers[next.DefaultRuntimeHandler]; !ok {
			c.Reason = fmt.Sprintf("runtime_handlers.%s is not in effect", next.DefaultRuntimeHandler)
		} else {
			eff.DefaultRuntimeHandler = next.DefaultRuntimeHandler
			c.Applied = true
		}
		changes = append(changes, c)
	}
	if next.Runtime != cur.Runtime {
		c := Change{Key: "runtime", Old: quote(cur.Runtime), New: quote(next.Runtime)}
		def := next.DefaultRuntimeHandler
		if reflect.DeepEqual(normHandler(eff.RuntimeHandlers[def]), normHandler(next.RuntimeHandlers[def])) {
			eff.Runtime = next.Runtime
			c.Applied = true
		} else {
			c.Reason = fmt.Sprintf("it is the binary of runtime_handlers.%s, which was kept", def)
		}
		changes = append(changes, c)
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].Key < changes[j].Key })
	return eff, changes
}

func planHandler(eff, next *config.Config, name string, c Change, inUse InUse) Change {
	n, inNext := next.RuntimeHandlers[name]
	_, inCur := eff.RuntimeHandlers[name]
	if !inCur {
		eff.RuntimeHandlers[name] = cloneHandler(n)
		c.Applied = true
		return c
	}
	if why := inUse(name); why != "" {
		verb := "changed"
		if !inNext {
			verb = "removed"
		}
		c.Reason = fmt.Sprintf("in use by %s: a handler is %s only when nothing uses it; kept until they are removed", why, verb)
		return c
	}
	if inNext {
		eff.RuntimeHandlers[name] = cloneHandler(n)
	} else {
		delete(eff.RuntimeHandlers, name)
	}
	c.Applied = true
	return c
}

// flatten renders each key of c as JSON: tables one level down
// (nri.enable), runtime handlers one entry each. Empty and absent lists
// compare equal.
func flatten(c *config.Config) map[string]string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("encode config: %v", err)) // plain data: cannot fail
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		panic(fmt.Sprintf("decode config: %v", err))
	}
	out := map[string]string{}
	for k, v := range top {
		switch k {
		case "runtime_handlers":
			for name, h := range c.RuntimeHandlers {
				out[k+"."+name] = render(normHandler(h))
			}
		case "runtime", "default_runtime_handler":
			// Compared by Plan itself.
		default:
			if m, ok := v.(map[string]any); ok {
				for sub, sv := range m {
					out[k+"."+sub] = render(sv)
				}
				continue
			}
			out[k] = render(v)
		}
	}
	return out
}

func render(v any) string {
	if v == nil {
		return "[]"
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode config value: %v", err))
	}
	return string(b)
}

func normHandler(h config.RuntimeHandler) config.RuntimeHandler {
	if len(h.Options) == 0 {
		h.Options = nil
	}
	return h
}

func cloneHandler(h config.RuntimeHandler) config.RuntimeHandler {
	h.Options = append([]string(nil), h.Options...)
	return h
}

func quote(s string) string { return render(s) }

func unionKeys(a, b map[string]string) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// clone deep-copies a configuration (it is plain data).
func clone(c *config.Config) *config.Config {
	out := *c
	out.CNIBinDirs = append([]string{}, c.CNIBinDirs...)
	out.PinnedImages = append([]string{}, c.PinnedImages...)
	out.DefaultUlimits = append([]string{}, c.DefaultUlimits...)
	out.CDISpecDirs = append([]string{}, c.CDISpecDirs...)
	out.RuntimeHandlers = make(map[string]config.RuntimeHandler, len(c.RuntimeHandlers))
	for name, h := range c.RuntimeHandlers {
		out.RuntimeHandlers[name] = cloneHandler(h)
	}
	return &out
}

// SameHandler tells whether two handler entries configure the same
// runtime (an empty and an absent options list are the same).
func SameHandler(a, b config.RuntimeHandler) bool {
	return reflect.DeepEqual(normHandler(a), normHandler(b))
}
