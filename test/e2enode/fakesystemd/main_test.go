package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// go-systemd's client, as the node e2e suite uses it (GetUnitNameByPID,
// StopUnit, StartUnit, waiting for each job's JobRemoved), against the
// stand-in running sleep as berthd.service.
func TestStopStartUnit(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "private")
	m := &manager{unit: "berthd.service", pidfile: filepath.Join(dir, "pid"), argv: []string{"sleep", "1000"},
		stopTimeout: time.Minute, conns: map[*conn]bool{}}
	if err := m.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.shutdown)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go m.accept(ln)

	ctx := context.Background()
	c, err := sddbus.NewConnection(func() (*dbus.Conn, error) {
		conn, err := dbus.Dial("unix:path=" + sock)
		if err != nil {
			return nil, err
		}
		if err := conn.Auth([]dbus.Auth{dbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	pid := readPid(t, m.pidfile)
	name, err := c.GetUnitNameByPID(ctx, uint32(pid))
	if err != nil || name != "berthd.service" {
		t.Fatalf("GetUnitNameByPID(%d) = %q, %v; want berthd.service", pid, name, err)
	}
	if _, err := c.GetUnitNameByPID(ctx, uint32(os.Getpid())); err == nil {
		t.Error("GetUnitNameByPID of the test's own pid: no error")
	}

	ch := make(chan string, 1)
	if _, err := c.StopUnitContext(ctx, "berthd.service", "replace", ch); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r != "done" {
		t.Fatalf("stop job: %s", r)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("pid %d still runs after StopUnit", pid)
	}
	if _, err := os.Stat(m.pidfile); !os.IsNotExist(err) {
		t.Errorf("pid file after StopUnit: %v", err)
	}

	if _, err := c.StartUnitContext(ctx, "berthd.service", "replace", ch); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r != "done" {
		t.Fatalf("start job: %s", r)
	}
	pid2 := readPid(t, m.pidfile)
	if pid2 == pid {
		t.Fatalf("same pid %d after StopUnit and StartUnit", pid)
	}
	if err := syscall.Kill(pid2, 0); err != nil {
		t.Errorf("pid %d after StartUnit: %v", pid2, err)
	}
	if _, err := c.StopUnitContext(ctx, "other.service", "replace", ch); err == nil {
		t.Error("StopUnit of an unknown unit: no error")
	}
	select {
	case <-m.exited:
		t.Error("the stand-in saw the stopped unit as exited on its own")
	default:
	}
}

func readPid(t *testing.T, f string) int {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
