package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/shim"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// ctrEnv is a daemon with the standard images pulled and one pod.
type ctrEnv struct {
	t      *testing.T
	d      *berthdtest.Daemon
	reg    *testimages.Registry
	pod    string
	podCfg *criapi.PodSandboxConfig
	logDir string
}

// newCtrEnv starts a berthd, pulls images (busybox when none) from a
// registry of the standard images and runs one pod.
func newCtrEnv(t *testing.T, images ...string) *ctrEnv {
	t.Helper()
	return newCtrEnvOn(t, berthdtest.Start(t, berthdtest.Options{}), images...)
}

// newCtrEnvOn is newCtrEnv on a daemon the test started itself.
func newCtrEnvOn(t *testing.T, d *berthdtest.Daemon, images ...string) *ctrEnv {
	t.Helper()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	if len(images) == 0 {
		images = []string{"busybox:latest"}
	}
	for _, img := range images {
		pull(t, d, reg.Ref(img), nil)
	}
	e := &ctrEnv{t: t, d: d, reg: reg, logDir: filepath.Join(d.Dir, "podlogs")}
	e.podCfg = podConfig(strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	e.podCfg.LogDirectory = e.logDir
	e.podCfg.Linux.CgroupParent = ""
	e.pod = runPod(t, d, e.podCfg)
	return e
}

// podEnv switches a ctrEnv to a pod of the test's own making.
func (e *ctrEnv) podEnv(cfg *criapi.PodSandboxConfig) *ctrEnv {
	e.t.Helper()
	cfg.LogDirectory = e.logDir
	pe := *e
	pe.podCfg = cfg
	pe.pod = runPod(e.t, e.d, cfg)
	return &pe
}

// config is a container running args in busybox with log <name>.log.
func (e *ctrEnv) config(name string, args ...string) *criapi.ContainerConfig {
	return &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: e.reg.Ref("busybox:latest")},
		Command:  args,
		LogPath:  name + ".log",
		Labels:   map[string]string{"name": name},
		// What the kubelet sends without shareProcessNamespace.
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

// create creates cfg in the env's pod and returns its ID.
func (e *ctrEnv) create(cfg *criapi.ContainerConfig) string {
	e.t.Helper()
	resp, err := e.d.Runtime.CreateContainer(berthdtest.Ctx(e.t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: cfg, SandboxConfig: e.podCfg})
	if err != nil {
		e.t.Fatalf("CreateContainer %s: %v", cfg.Metadata.Name, err)
	}
	return resp.ContainerId
}

// start starts container id.
func (e *ctrEnv) start(id string) {
	e.t.Helper()
	if _, err := e.d.Runtime.StartContainer(berthdtest.Ctx(e.t), &criapi.StartContainerRequest{ContainerId: id}); err != nil {
		e.t.Fatalf("StartContainer: %v", err)
	}
}

// run creates and starts cfg in the env's pod and returns its ID.
func (e *ctrEnv) run(cfg *criapi.ContainerConfig) string {
	e.t.Helper()
	id := e.create(cfg)
	e.start(id)
	return id
}

// status is container id's ContainerStatus.
func (e *ctrEnv) status(id string) *criapi.ContainerStatus {
	e.t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(berthdtest.Ctx(e.t), &criapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		e.t.Fatalf("ContainerStatus: %v", err)
	}
	return resp.Status
}

// waitExited waits until container id has exited and returns its status.
func (e *ctrEnv) waitExited(id string) *criapi.ContainerStatus {
	e.t.Helper()
	var st *criapi.ContainerStatus
	waitUntil(e.t, "container "+id+" to exit", func() error {
		if st = e.status(id); st.State != criapi.ContainerState_CONTAINER_EXITED {
			return fmt.Errorf("still %s", st.State)
		}
		return nil
	})
	return st
}

// output runs a container to completion and returns its stdout lines.
func (e *ctrEnv) output(cfg *criapi.ContainerConfig) ([]string, *criapi.ContainerStatus) {
	e.t.Helper()
	id := e.run(cfg)
	st := e.waitExited(id)
	var lines []string
	for _, r := range readCRILog(e.t, st.LogPath) {
		lines = append(lines, r.msg)
	}
	return lines, st
}

// exec runs cmd in container id, failing unless it exits 0, and
// returns its trimmed stdout.
func (e *ctrEnv) exec(id string, cmd ...string) string {
	e.t.Helper()
	resp, err := e.d.Runtime.ExecSync(berthdtest.Ctx(e.t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 10})
	if err != nil {
		e.t.Fatalf("ExecSync %v in %s: %v", cmd, id, err)
	}
	if resp.ExitCode != 0 {
		e.t.Fatalf("ExecSync %v in %s: exit %d: %s", cmd, id, resp.ExitCode, resp.Stderr)
	}
	return strings.TrimSpace(string(resp.Stdout))
}

// execSync is ExecSync of cmd in container id, with timeout seconds.
func execSync(t *testing.T, d *berthdtest.Daemon, id string, timeout int64, cmd ...string) (*criapi.ExecSyncResponse, error) {
	t.Helper()
	return d.Runtime.ExecSync(berthdtest.Ctx(t), &criapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: timeout})
}

// containerPid finds the container's init pid from the runtime's state.
func containerPid(t *testing.T, d *berthdtest.Daemon, id string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.Root, "containers", id, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// closeStdin closes a container's stdin straight through its shim (CRI
// Attach belongs to the streaming server), working while berthd is down.
func closeStdin(t *testing.T, d *berthdtest.Daemon, pod, id string) {
	t.Helper()
	s, err := shim.NewClient(filepath.Join(d.State, "shims", pod)).Attach(context.Background(), id, true, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// criLogLine is one line of a CRI log file: time, stream, tag, message.
var criLogLine = regexp.MustCompile(`^(\S+) (stdout|stderr) (F|P) (.*)$`)

// logRecord is one parsed CRI log line.
type logRecord struct {
	stream, tag, msg string
}

// readCRILog parses a CRI log file, failing on any malformed line.
func readCRILog(t *testing.T, path string) []logRecord {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read log: %v", err)
	}
	var recs []logRecord
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		m := criLogLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("log line not in CRI format: %q", line)
		}
		if _, err := time.Parse(time.RFC3339Nano, m[1]); err != nil {
			t.Fatalf("bad timestamp in %q: %v", line, err)
		}
		recs = append(recs, logRecord{m[2], m[3], m[4]})
	}
	return recs
}

// containerStats is container id's ContainerStats.
func containerStats(t *testing.T, d *berthdtest.Daemon, id string) *criapi.ContainerStats {
	t.Helper()
	resp, err := d.Runtime.ContainerStats(berthdtest.Ctx(t), &criapi.ContainerStatsRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStats %s: %v", id, err)
	}
	return resp.Stats
}

// recvEvents collects events from a stream until n arrived or it fails.
func recvEvents(t *testing.T, stream criapi.RuntimeService_GetContainerEventsClient, n int) []*criapi.ContainerEventResponse {
	t.Helper()
	var out []*criapi.ContainerEventResponse
	for len(out) < n {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, ev)
	}
	return out
}
