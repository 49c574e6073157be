package berthdtest

import (
	"context"
	"os"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/admin"
	"github.com/berthcri/berth/internal/config"
)

// RunningConfig is the admin service's Config answer: the configuration
// in effect ("toml", "generation") and what the reloads did ("reloads",
// "lastReload"); `berthd config --running` prints it.
func (d *Daemon) RunningConfig() map[string]any {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := admin.Config(ctx, d.conn)
	if err != nil {
		d.t.Fatalf("admin Config: %v", err)
	}
	return res.AsMap()
}

// Reconfigure edits the daemon's configuration (d.Config, then its file)
// and reloads it with SIGHUP; it returns the reload's "lastReload". Keys
// the test's cleanup reads from d.Config (cgroup_parent, root, state) must
// not change this way: write such a file with ReloadFile.
func (d *Daemon) Reconfigure(edit func(*config.Config)) map[string]any {
	d.t.Helper()
	edit(d.Config)
	data, err := d.Config.TOML()
	if err != nil {
		d.t.Fatalf("encode config: %v", err)
	}
	return d.ReloadFile(data)
}

// ReloadFile writes data as the daemon's config file and reloads it with
// SIGHUP; it returns the reload's "lastReload" (result, changes, error).
// d.Config is left as it was.
func (d *Daemon) ReloadFile(data []byte) map[string]any {
	d.t.Helper()
	if err := os.WriteFile(d.ConfigPath, data, 0o644); err != nil {
		d.t.Fatalf("write config: %v", err)
	}
	return d.Reload()
}

// Reload sends SIGHUP and waits until the daemon has done the reload (its
// count of reloads grew), failing the test if that takes over 30 s. It
// returns the reload's "lastReload".
func (d *Daemon) Reload() map[string]any {
	d.t.Helper()
	before := reloadCount(d.RunningConfig())
	if err := syscall.Kill(d.Pid(), syscall.SIGHUP); err != nil {
		d.t.Fatalf("SIGHUP berthd: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cfg := d.RunningConfig()
		if reloadCount(cfg) > before {
			last, _ := cfg["lastReload"].(map[string]any)
			return last
		}
		select {
		case <-d.Exited():
			d.t.Fatalf("berthd exited on SIGHUP (%v); logs:\n%s", d.ExitErr(), d.Logs())
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("berthd did not reload within 30s of SIGHUP; logs:\n%s", d.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func reloadCount(cfg map[string]any) float64 {
	r, _ := cfg["reloads"].(map[string]any)
	var n float64
	for _, v := range r {
		f, _ := v.(float64)
		n += f
	}
	return n
}
