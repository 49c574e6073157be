package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/hostprobe"
	"github.com/berthcri/berth/internal/liveconfig"
	"github.com/berthcri/berth/internal/metrics"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/sigpolicy"
)

// reloader is what Reload needs besides the components, and what the
// last reloads did (berthd config --running shows it).
type reloader struct {
	// mu serialises reloads.
	mu sync.Mutex
	// load reads the configuration again as berthd read it at start:
	// defaults, the file, the command line's flags. nil: no reload.
	load func() (*config.Config, error)
	// level is the logger's level, which log_level sets.
	level *slog.LevelVar

	statusMu sync.Mutex
	counts   map[string]int
	last     *ReloadStatus
}

// ReloadStatus is what one reload did.
type ReloadStatus struct {
	// Result is metrics.ReloadSuccess, ReloadPartial or ReloadFailure.
	Result string
	At     time.Time
	// Error is why the file was refused (failure only).
	Error string
	// Generation is the snapshot's after the reload.
	Generation uint64
	// Changes are the keys that differed, applied or not.
	Changes []liveconfig.Change
}

// EnableReload makes Reload read the configuration with load and set the
// log level in level (the logger's). Call it before Serve.
func (d *Daemon) EnableReload(load func() (*config.Config, error), level *slog.LevelVar) {
	d.reload.mu.Lock()
	defer d.reload.mu.Unlock()
	d.reload.load, d.reload.level = load, level
}

// handlersOf pairs each handler of cfg with its runtime and features.
func handlersOf(cfg *config.Config, runtimes map[string]*oci.Runtime, features map[string]liveconfig.Features) map[string]*liveconfig.Handler {
	out := make(map[string]*liveconfig.Handler, len(cfg.RuntimeHandlers))
	for name, h := range cfg.RuntimeHandlers {
		out[name] = &liveconfig.Handler{Name: name, Config: h, Runtime: runtimes[name], Features: features[name]}
	}
	return out
}

// Reload reads the configuration again (SIGHUP) and puts in effect what
// can change while berthd runs; it logs every changed key it keeps, and
// why. A configuration that does not load or validate is refused whole:
// the one in effect stays. Requests that started before keep the
// snapshot they loaded.
func (d *Daemon) Reload(ctx context.Context) ReloadStatus {
	d.reload.mu.Lock()
	defer d.reload.mu.Unlock()
	st := d.reloadLocked(ctx)
	st.At = time.Now()
	d.m.ConfigReloads.WithLabelValues(st.Result).Inc()
	d.reload.statusMu.Lock()
	if d.reload.counts == nil {
		d.reload.counts = map[string]int{}
	}
	d.reload.counts[st.Result]++
	d.reload.last = &st
	d.reload.statusMu.Unlock()
	return st
}

func (d *Daemon) reloadLocked(ctx context.Context) ReloadStatus {
	log := d.log.With("component", "config")
	cur := d.live.Load()
	if d.reload.load == nil {
		return ReloadStatus{Result: metrics.ReloadFailure, Error: "this berthd cannot reload its configuration", Generation: cur.Generation}
	}
	next, err := d.reload.load()
	if err != nil {
		log.Error("configuration reload refused: the configuration in effect stays", "generation", cur.Generation, "error", err)
		return ReloadStatus{Result: metrics.ReloadFailure, Error: err.Error(), Generation: cur.Generation}
	}
	// The signature policy is read now, whole: a file that does not parse
	// refuses the reload like a config file that does not.
	policy, err := sigpolicy.Load(next.SignaturePolicy)
	if err != nil {
		log.Error("configuration reload refused: the configuration in effect stays", "generation", cur.Generation, "error", err)
		return ReloadStatus{Result: metrics.ReloadFailure, Error: err.Error(), Generation: cur.Generation}
	}
	// Handlers the file adds or changes get their runtime and features
	// now, outside the holder's lock that starting pods take. Reloads are
	// serialised, so cur is still in effect when Swap runs.
	fresh := map[string]*oci.Runtime{}
	for name, h := range next.RuntimeHandlers {
		if old, ok := cur.Handler(name); ok && liveconfig.SameHandler(old.Config, h) {
			continue
		}
		fresh[name] = liveconfig.NewRuntime(cur.Config, name, h)
	}
	features := hostprobe.RuntimeFeatures(ctx, fresh, d.sandboxes.UserNamespaceSupport(), log)

	var changes []liveconfig.Change
	snap, err := d.live.Swap(func(cur *liveconfig.Snapshot, starting func(string) int) (*liveconfig.Snapshot, error) {
		var eff *config.Config
		eff, changes = liveconfig.Plan(cur.Config, next, d.handlerUse(starting))
		if c, changed := policyChange(cur, next.SignaturePolicy, policy); changed {
			changes = mergePolicyChange(changes, c)
		}
		if !anyApplied(changes) {
			return nil, nil
		}
		handlers := map[string]*liveconfig.Handler{}
		for name, hc := range eff.RuntimeHandlers {
			if old, ok := cur.Handler(name); ok && liveconfig.SameHandler(old.Config, hc) {
				handlers[name] = old
				continue
			}
			handlers[name] = &liveconfig.Handler{Name: name, Config: hc, Runtime: fresh[name], Features: features[name]}
		}
		snap := liveconfig.NewSnapshot(cur.Generation+1, eff, handlers)
		snap.SignaturePolicy = policy
		return snap, nil
	})
	if err != nil { // fn returns none; kept for the signature
		log.Error("configuration reload refused: the configuration in effect stays", "error", err)
		return ReloadStatus{Result: metrics.ReloadFailure, Error: err.Error(), Generation: cur.Generation}
	}
	st := ReloadStatus{Result: metrics.ReloadSuccess, Generation: snap.Generation, Changes: changes}
	applied := 0
	for _, c := range changes {
		if c.Applied {
			applied++
			log.Info("configuration reload: applied", "key", c.Key, "old", c.Old, "new", c.New)
			continue
		}
		st.Result = metrics.ReloadPartial
		log.Warn("configuration reload: not applied", "key", c.Key, "in_effect", c.Old, "in_file", c.New, "reason", c.Reason)
	}
	log.Info("configuration reloaded", "generation", snap.Generation, "applied", applied, "not_applied", len(changes)-applied, "result", st.Result)
	// Last, so that the reload's own lines show under the level in effect
	// when it was asked for.
	if d.reload.level != nil {
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(snap.Config.LogLevel)); err == nil {
			d.reload.level.Set(lvl)
		}
	}
	return st
}

// policyChange tells whether the policy read by a reload differs from
// the one in effect: another file, or the same file with other bytes.
// Its Old and New name the file and its content's digest.
func policyChange(cur *liveconfig.Snapshot, path string, next *sigpolicy.Policy) (liveconfig.Change, bool) {
	was, now := sigpolicy.DigestOf(cur.SignaturePolicy), sigpolicy.DigestOf(next)
	if cur.Config.SignaturePolicy == path && was == now {
		return liveconfig.Change{}, false
	}
	describe := func(path, digest string) string {
		if digest == "" {
			digest = "absent: accept anything"
		}
		return fmt.Sprintf("%q (%s)", path, digest)
	}
	return liveconfig.Change{
		Key: "signature_policy", Old: describe(cur.Config.SignaturePolicy, was), New: describe(path, now), Applied: true,
	}, true
}

// mergePolicyChange puts the policy's change in place of Plan's entry for
// the key (which only saw the path), keeping the list sorted.
func mergePolicyChange(changes []liveconfig.Change, c liveconfig.Change) []liveconfig.Change {
	for i := range changes {
		if changes[i].Key == c.Key {
			changes[i] = c
			return changes
		}
	}
	changes = append(changes, c)
	sort.Slice(changes, func(i, j int) bool { return changes[i].Key < changes[j].Key })
	return changes
}

// logPolicy says at start which signature policy is in effect.
func logPolicy(log *slog.Logger, p *sigpolicy.Policy, path string) {
	if p == nil {
		log.Info("image signature policy: none, every image is accepted", "signature_policy", path)
		return
	}
	log.Info("image signature policy loaded", "signature_policy", path, "digest", p.Digest, "scopes", p.Scopes())
}

func anyApplied(changes []liveconfig.Change) bool {
	for _, c := range changes {
		if c.Applied {
			return true
		}
	}
	return false
}

// handlerUse tells what uses each runtime handler now: recorded pods and
// containers, and pods being started (starting). Called under the
// holder's lock, so no pod can be admitted with a handler meanwhile.
func (d *Daemon) handlerUse(starting func(string) int) liveconfig.InUse {
	pods := map[string][]string{}
	for sb := range d.sandboxes.All() {
		pods[sb.RuntimeHandler] = append(pods[sb.RuntimeHandler], sb.ID)
	}
	ctrs := map[string]int{}
	for c := range d.containers.All() {
		ctrs[c.Runtime]++
	}
	return func(handler string) string {
		var parts []string
		if ids := pods[handler]; len(ids) > 0 {
			sort.Strings(ids)
			shown := make([]string, 0, 3)
			for _, id := range ids[:min(3, len(ids))] {
				shown = append(shown, id[:min(12, len(id))])
			}
			more := ""
			if len(ids) > len(shown) {
				more = ", …"
			}
			parts = append(parts, fmt.Sprintf("%d pod(s) (%s%s)", len(ids), strings.Join(shown, ", "), more))
		}
		if n := ctrs[handler]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d container(s)", n))
		}
		if handler != "" {
			if n := starting(handler); n > 0 {
				parts = append(parts, fmt.Sprintf("%d pod(s) starting", n))
			}
		}
		return strings.Join(parts, ", ")
	}
}

// configInfo is the admin service's Config answer: the configuration in
// effect and what the reloads did.
func (d *Daemon) configInfo() (map[string]any, error) {
	live := d.live.Load()
	text, err := live.Config.TOML()
	if err != nil {
		return nil, err
	}
	out := map[string]any{
		"generation": float64(live.Generation),
		"toml":       string(text),
		"liveKeys":   toAny(liveconfig.LiveKeys()),
	}
	sp := map[string]any{"path": live.Config.SignaturePolicy, "digest": sigpolicy.DigestOf(live.SignaturePolicy), "scopes": []any{}}
	if live.SignaturePolicy != nil {
		sp["scopes"] = toAny(live.SignaturePolicy.Scopes())
	}
	out["signaturePolicy"] = sp
	d.reload.statusMu.Lock()
	defer d.reload.statusMu.Unlock()
	counts := map[string]any{}
	for _, r := range []string{metrics.ReloadSuccess, metrics.ReloadPartial, metrics.ReloadFailure} {
		counts[r] = float64(d.reload.counts[r])
	}
	out["reloads"] = counts
	if st := d.reload.last; st != nil {
		changes := make([]any, 0, len(st.Changes))
		for _, c := range st.Changes {
			changes = append(changes, map[string]any{"key": c.Key, "old": c.Old, "new": c.New, "applied": c.Applied, "reason": c.Reason})
		}
		out["lastReload"] = map[string]any{
			"result": st.Result, "at": st.At.UTC().Format(time.RFC3339Nano), "error": st.Error,
			"generation": float64(st.Generation), "changes": changes,
		}
	}
	return out, nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
