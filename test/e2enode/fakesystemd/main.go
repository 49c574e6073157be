// Command fakesystemd stands in for systemd's private D-Bus socket
// (/run/systemd/private) in make e2e-node's mount namespace (no systemd on
// the machines berth is tested on), with one unit: the container runtime.
// It runs the given command (berthd) as that unit and answers what the
// node e2e suite asks of systemd over D-Bus to stop and start the runtime
// (the MirrorPodWithGracePeriod spec whose runtime is down during pod
// termination; go-systemd's dbus package): GetUnitByPID, StopUnit,
// StartUnit, RestartUnit, each job ending with the JobRemoved signal, and
// AddMatch. Everything else is answered with UnknownMethod. A test
// fixture, not part of berth.
//
//	fakesystemd -socket /run/systemd/private -unit berthd.service -pidfile F -- berthd --config ...
//
// writes the runtime's pid to F each time it starts it; on SIGTERM or
// SIGINT it stops the runtime (SIGTERM, then SIGKILL after -stop-timeout)
// and exits. It exits too when the runtime exits on its own.
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/godbus/dbus/v5"
)

func main() {
	socket := flag.String("socket", "/run/systemd/private", "the socket to listen on")
	unit := flag.String("unit", "berthd.service", "the unit the command runs as")
	pidfile := flag.String("pidfile", "", "where to write the command's pid")
	stopTimeout := flag.Duration("stop-timeout", 90*time.Second, "SIGKILL the command this long after SIGTERM")
	flag.Parse()
	if flag.NArg() == 0 || *pidfile == "" {
		fmt.Fprintln(os.Stderr, "usage: fakesystemd -socket PATH -unit NAME -pidfile FILE -- COMMAND ARGS...")
		os.Exit(2)
	}
	m := &manager{unit: *unit, pidfile: *pidfile, argv: flag.Args(), stopTimeout: *stopTimeout, conns: map[*conn]bool{}}
	if err := m.start(); err != nil {
		slog.Error("start the unit", "unit", m.unit, "err", err)
		os.Exit(1)
	}
	os.Remove(*socket)
	ln, err := net.Listen("unix", *socket)
	if err != nil {
		slog.Error("listen", "socket", *socket, "err", err)
		m.shutdown()
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go m.accept(ln)
	status := 0
	select {
	case s := <-sigs:
		slog.Info("stopping", "signal", s.String())
		m.shutdown()
	case <-m.exited:
		slog.Error("the unit's process exited on its own", "unit", m.unit)
		status = 1
	}
	ln.Close()
	os.Remove(*socket)
	os.Exit(status)
}

// manager runs the unit's command and keeps the connections to signal.
type manager struct {
	unit, pidfile string
	argv          []string
	stopTimeout   time.Duration

	mu      sync.Mutex // held across a whole job: jobs run one at a time
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has been waited for
	exited  chan struct{} // closed when cmd exits without a stop job
	stopped bool          // the current cmd is being stopped on purpose
	jobID   uint32

	connMu sync.Mutex
	conns  map[*conn]bool
}

// start runs the command if it does not run. Called with mu held (or
// before serving).
func (m *manager) start() error {
	if m.cmd != nil {
		return nil
	}
	cmd := exec.Command(m.argv[0], m.argv[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", m.argv[0], err)
	}
	if err := os.WriteFile(m.pidfile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("write pid file: %w", err)
	}
	slog.Info("started", "unit", m.unit, "pid", cmd.Process.Pid)
	m.cmd, m.done, m.stopped = cmd, make(chan struct{}), false
	if m.exited == nil {
		m.exited = make(chan struct{})
	}
	done, exited := m.done, m.exited
	go func() {
		err := cmd.Wait()
		slog.Info("exited", "unit", m.unit, "pid", cmd.Process.Pid, "status", fmt.Sprint(err))
		// Read stopped before closing done: once done is closed, stop()
		// returns and a StartUnit may reset stopped for the next run.
		// stop() releases mu while it waits, so taking it here is safe.
		m.mu.Lock()
		unexpected := !m.stopped
		m.mu.Unlock()
		close(done)
		if unexpected {
			close(exited)
		}
	}()
	return nil
}

// stop ends the command (SIGTERM, SIGKILL after stopTimeout) and waits
// for it. Called with mu held (or on the way out).
func (m *manager) stop() {
	if m.cmd == nil {
		return
	}
	m.stopped = true
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(m.stopTimeout):
		cmd.Process.Kill()
		<-done
	}
	m.mu.Lock()
	m.cmd = nil
	os.Remove(m.pidfile)
}

// shutdown stops the command for good.
func (m *manager) shutdown() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stop()
}

// accept serves each connection to ln until ln is closed.
func (m *manager) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go m.serve(c)
	}
}

func (m *manager) pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

const (
	managerPath  = dbus.ObjectPath("/org/freedesktop/systemd1")
	managerIface = "org.freedesktop.systemd1.Manager"
)

// unitPath is the unit's object path as systemd escapes it
// (berthd.service → .../unit/berthd_2eservice).
func unitPath(name string) dbus.ObjectPath {
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' && i > 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return dbus.ObjectPath("/org/freedesktop/systemd1/unit/" + b.String())
}

// job runs StopUnit, StartUnit or RestartUnit on the unit in the
// background: the reply (the job's path) goes out first, JobRemoved with
// the result when it is done, as systemd does.
func (m *manager) job(c *conn, call *dbus.Message, member string) {
	var name, mode string
	if err := dbus.Store(call.Body, &name, &mode); err != nil {
		c.sendError(call, "org.freedesktop.DBus.Error.InvalidArgs", err.Error())
		return
	}
	if name != m.unit {
		c.sendError(call, "org.freedesktop.systemd1.NoSuchUnit", fmt.Sprintf("Unit %s not loaded.", name))
		return
	}
	m.connMu.Lock()
	m.jobID++
	id := m.jobID
	m.connMu.Unlock()
	path := dbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", id))
	c.sendReply(call, path)
	go func() {
		m.mu.Lock()
		result := "done"
		if member != "StartUnit" {
			m.stop()
		}
		if member != "StopUnit" {
			if err := m.start(); err != nil {
				slog.Error("start the unit", "unit", m.unit, "err", err)
				result = "failed"
			}
		}
		m.mu.Unlock()
		slog.Info("job", "id", id, "op", member, "unit", name, "result", result)
		m.connMu.Lock()
		conns := make([]*conn, 0, len(m.conns))
		for c := range m.conns {
			conns = append(conns, c)
		}
		m.connMu.Unlock()
		for _, c := range conns {
			c.sendSignal(managerPath, managerIface, "JobRemoved", id, path, name, result)
		}
	}()
}

// conn is one client connection (go-systemd opens two: calls, signals).
type conn struct {
	nc     net.Conn
	mu     sync.Mutex // serializes writes and the serial
	serial uint32
}

func (m *manager) serve(nc net.Conn) {
	defer nc.Close()
	rd := bufio.NewReader(nc)
	if err := auth(rd, nc); err != nil {
		slog.Warn("auth", "err", err)
		return
	}
	c := &conn{nc: nc}
	m.connMu.Lock()
	m.conns[c] = true
	m.connMu.Unlock()
	defer func() {
		m.connMu.Lock()
		delete(m.conns, c)
		m.connMu.Unlock()
	}()
	for {
		msg, err := dbus.DecodeMessage(rd)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				slog.Warn("read message", "err", err)
			}
			return
		}
		if msg.Type != dbus.TypeMethodCall {
			continue
		}
		iface, _ := msg.Headers[dbus.FieldInterface].Value().(string)
		member, _ := msg.Headers[dbus.FieldMember].Value().(string)
		switch {
		case member == "Hello":
			c.sendReply(msg, ":1.1")
		case iface == "org.freedesktop.DBus" && (member == "AddMatch" || member == "RemoveMatch"):
			c.sendReply(msg)
		case iface == managerIface && member == "Subscribe":
			c.sendReply(msg)
		case iface == managerIface && member == "GetUnitByPID":
			var pid uint32
			if err := dbus.Store(msg.Body, &pid); err != nil {
				c.sendError(msg, "org.freedesktop.DBus.Error.InvalidArgs", err.Error())
				continue
			}
			if p := m.pid(); p != 0 && uint32(p) == pid {
				c.sendReply(msg, unitPath(m.unit))
			} else {
				c.sendError(msg, "org.freedesktop.systemd1.NoUnitForPID", fmt.Sprintf("PID %d does not belong to any loaded unit.", pid))
			}
		case iface == managerIface && (member == "StopUnit" || member == "StartUnit" || member == "RestartUnit"):
			m.job(c, msg, member)
		default:
			c.sendError(msg, "org.freedesktop.DBus.Error.UnknownMethod", fmt.Sprintf("fakesystemd: %s.%s is not implemented", iface, member))
		}
	}
}

// auth is the server's side of the SASL exchange: EXTERNAL accepted as
// given, unix fd passing declined.
func auth(rd *bufio.Reader, w io.Writer) error {
	if b, err := rd.ReadByte(); err != nil || b != 0 {
		return fmt.Errorf("no leading nul byte (%v)", err)
	}
	guid := make([]byte, 16)
	if _, err := rand.Read(guid); err != nil {
		return err
	}
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return fmt.Errorf("read auth line: %w", err)
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var reply string
		switch f[0] {
		case "AUTH":
			if len(f) >= 2 && f[1] == "EXTERNAL" {
				reply = "OK " + hex.EncodeToString(guid)
			} else {
				reply = "REJECTED EXTERNAL"
			}
		case "NEGOTIATE_UNIX_FD":
			reply = "ERROR"
		case "BEGIN":
			return nil
		default:
			reply = "ERROR"
		}
		if _, err := io.WriteString(w, reply+"\r\n"); err != nil {
			return err
		}
	}
}

// send encodes msg with the connection's next serial (godbus keeps the
// serial unexported: it is patched into the fixed header, bytes 8-11).
func (c *conn) send(msg *dbus.Message) {
	if len(msg.Body) > 0 {
		msg.Headers[dbus.FieldSignature] = dbus.MakeVariant(dbus.SignatureOf(msg.Body...))
	}
	var buf bytes.Buffer
	if err := msg.EncodeTo(&buf, binary.LittleEndian); err != nil {
		slog.Warn("encode message", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.serial++
	b := buf.Bytes()
	binary.LittleEndian.PutUint32(b[8:12], c.serial)
	if _, err := c.nc.Write(b); err != nil {
		slog.Warn("write message", "err", err)
	}
}

func (c *conn) sendReply(call *dbus.Message, body ...any) {
	c.send(&dbus.Message{
		Type:    dbus.TypeMethodReply,
		Headers: map[dbus.HeaderField]dbus.Variant{dbus.FieldReplySerial: dbus.MakeVariant(call.Serial())},
		Body:    body,
	})
}

func (c *conn) sendError(call *dbus.Message, name, text string) {
	c.send(&dbus.Message{
		Type: dbus.TypeError,
		Headers: map[dbus.HeaderField]dbus.Variant{
			dbus.FieldReplySerial: dbus.MakeVariant(call.Serial()),
			dbus.FieldErrorName:   dbus.MakeVariant(name),
		},
		Body: []any{text},
	})
}

func (c *conn) sendSignal(path dbus.ObjectPath, iface, member string, body ...any) {
	c.send(&dbus.Message{
		Type: dbus.TypeSignal,
		Headers: map[dbus.HeaderField]dbus.Variant{
			dbus.FieldPath:      dbus.MakeVariant(path),
			dbus.FieldInterface: dbus.MakeVariant(iface),
			dbus.FieldMember:    dbus.MakeVariant(member),
		},
		Body: body,
	})
}
