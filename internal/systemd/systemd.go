// Package systemd drives systemd's unit manager over D-Bus for the systemd
// cgroup driver: pod slices are transient slice units started, limited,
// listed and stopped through it. Containers' scopes are runc's business
// (runc --systemd-cgroup); this package only names them.
package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/berthcri/berth/internal/errdefs"
)

// BootedDir exists exactly when systemd is the running init (sd_booted(3)).
const BootedDir = "/run/systemd/system"

// CheckRunning reports, as ErrFailedPrecondition, that systemd is not the
// running init, so that the systemd driver can refuse at daemon start.
func CheckRunning() error {
	return checkRunning(BootedDir)
}

func checkRunning(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil && fi.IsDir() {
		return nil
	}
	return fmt.Errorf("cgroup_driver is systemd but systemd is not running on this node (no %s): use cgroup_driver = \"cgroupfs\" here, and cgroupDriver: cgroupfs in the kubelet: %w", dir, errdefs.ErrFailedPrecondition)
}

// jobTimeout bounds the wait for one systemd job (start or stop of a unit).
const jobTimeout = 30 * time.Second

// Units is a connection to systemd's unit manager. It dials again when
// systemd dropped the connection (daemon-reexec, restart of dbus).
type Units struct {
	log *slog.Logger

	mu   sync.Mutex
	conn *sddbus.Conn
}

// Dial connects to systemd: the system bus if there is one, else, as root,
// systemd's private socket (/run/systemd/private).
func Dial(ctx context.Context, log *slog.Logger) (*Units, error) {
	if err := CheckRunning(); err != nil {
		return nil, err
	}
	u := &Units{log: log}
	if _, err := u.connection(ctx); err != nil {
		return nil, err
	}
	return u, nil
}

// Close drops the connection.
func (u *Units) Close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
}

func (u *Units) connection(ctx context.Context) (*sddbus.Conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.conn != nil && u.conn.Connected() {
		return u.conn, nil
	}
	if u.conn != nil {
		u.conn.Close()
		u.log.Warn("reconnecting to systemd")
	}
	c, err := sddbus.NewWithContext(ctx)
	if err != nil {
		u.conn = nil
		return nil, fmt.Errorf("connect to systemd over D-Bus: %v: %w", err, errdefs.ErrFailedPrecondition)
	}
	u.conn = c
	return c, nil
}

// call runs f on a live connection, once more on a fresh one when the
// first attempt found the connection closed.
func (u *Units) call(ctx context.Context, f func(*sddbus.Conn) error) error {
	for try := 0; ; try++ {
		c, err := u.connection(ctx)
		if err != nil {
			return err
		}
		err = f(c)
		if err == nil || try > 0 || !errors.Is(err, godbus.ErrClosed) {
			return err
		}
	}
}

// isNoSuchUnit reports systemd's "unit not loaded/does not exist" errors.
func isNoSuchUnit(err error) bool {
	var de godbus.Error
	if errors.As(err, &de) {
		return de.Name == "org.freedesktop.systemd1.NoSuchUnit" || de.Name == "org.freedesktop.systemd1.LoadFailed"
	}
	return false
}

// isUnitExists reports that a transient unit of that name is already there.
func isUnitExists(err error) bool {
	var de godbus.Error
	return errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.UnitExists"
}

// waitJob waits for a job's result on ch.
func waitJob(ctx context.Context, what string, ch <-chan string) error {
	t := time.NewTimer(jobTimeout)
	defer t.Stop()
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("%s: systemd job result %q", what, res)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("%s: no answer from systemd in %s: %w", what, jobTimeout, errdefs.ErrDeadlineExceeded)
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
}

// StartSlice starts the transient slice unit name with props. A slice of
// that name already active (a retried Run) is reused with props applied.
func (u *Units) StartSlice(ctx context.Context, name string, props []sddbus.Property) error {
	what := "start " + name
	ch := make(chan string, 1)
	err := u.call(ctx, func(c *sddbus.Conn) error {
		_, err := c.StartTransientUnitContext(ctx, name, "replace", props, ch)
		return err
	})
	if isUnitExists(err) {
		return u.SetProperties(ctx, name, props)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return waitJob(ctx, what, ch)
}

// Stop stops unit name (and, for a slice, everything in it) and forgets a
// failed state. A unit systemd does not know is already stopped.
func (u *Units) Stop(ctx context.Context, name string) error {
	what := "stop " + name
	ch := make(chan string, 1)
	err := u.call(ctx, func(c *sddbus.Conn) error {
		_, err := c.StopUnitContext(ctx, name, "replace", ch)
		return err
	})
	if isNoSuchUnit(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := waitJob(ctx, what, ch); err != nil {
		return err
	}
	_ = u.call(ctx, func(c *sddbus.Conn) error { return c.ResetFailedUnitContext(ctx, name) })
	return nil
}

// SetProperties changes a running unit's properties for this boot only
// (runtime=true: nothing is written under /etc).
func (u *Units) SetProperties(ctx context.Context, name string, props []sddbus.Property) error {
	if len(props) == 0 {
		return nil
	}
	err := u.call(ctx, func(c *sddbus.Conn) error { return c.SetUnitPropertiesContext(ctx, name, true, props...) })
	if isNoSuchUnit(err) {
		return fmt.Errorf("unit %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("set properties of %s: %w", name, err)
	}
	return nil
}

// ControlGroup is the cgroup systemd gave unit name, relative to the
// hierarchy roots (it includes systemd's own root when systemd runs in a
// container). unitType is "Slice" or "Scope".
func (u *Units) ControlGroup(ctx context.Context, name, unitType string) (string, error) {
	var p *sddbus.Property
	err := u.call(ctx, func(c *sddbus.Conn) error {
		var err error
		p, err = c.GetUnitTypePropertyContext(ctx, name, unitType, "ControlGroup")
		return err
	})
	if isNoSuchUnit(err) {
		return "", fmt.Errorf("unit %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("read ControlGroup of %s: %w", name, err)
	}
	cg, _ := p.Value.Value().(string)
	if cg == "" {
		return "", fmt.Errorf("unit %s has no cgroup: %w", name, errdefs.ErrNotFound)
	}
	return filepath.Clean(cg), nil
}

// List returns the names of loaded units matching any of the glob
// patterns, in any state.
func (u *Units) List(ctx context.Context, patterns []string) ([]string, error) {
	var units []sddbus.UnitStatus
	err := u.call(ctx, func(c *sddbus.Conn) error {
		var err error
		units, err = c.ListUnitsByPatternsContext(ctx, nil, patterns)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list units %s: %w", strings.Join(patterns, " "), err)
	}
	names := make([]string, 0, len(units))
	for _, st := range units {
		names = append(names, st.Name)
	}
	return names, nil
}

// StartScope starts transient scope name in slice holding pid, for a
// process berth started itself (a pod's pause holder): a slice cannot
// hold processes directly.
func (u *Units) StartScope(ctx context.Context, name, slice string, pid int) error {
	props := []sddbus.Property{
		sddbus.PropDescription("berth " + name),
		sddbus.PropSlice(slice),
		sddbus.PropPids(uint32(pid)),
		prop("DefaultDependencies", false),
	}
	what := "start " + name
	ch := make(chan string, 1)
	err := u.call(ctx, func(c *sddbus.Conn) error {
		_, err := c.StartTransientUnitContext(ctx, name, "replace", props, ch)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return waitJob(ctx, what, ch)
}
