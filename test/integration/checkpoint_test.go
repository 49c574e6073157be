package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// The containers of the checkpoint tests. counter keeps a count in its
// shell's memory (written to a file of its writable layer each tick) and
// a marker file; server answers each TCP connection on 8080 with a token
// drawn once at start and held only in its shell's memory.
const (
	counterScript = `echo hello > /data.txt; i=0; while true; do i=$((i+1)); echo $i > /tmp/count; [ $((i % 5)) = 0 ] && echo tick $i; sleep 0.1; done`
	serverScript  = `t=$RANDOM$RANDOM; echo $t > /token; while true; do nc -l -p 8080 -e echo $t; done`
)

func (e *ctrEnv) counterConfigs() []*criapi.ContainerConfig {
	return []*criapi.ContainerConfig{
		e.config("counter", "sh", "-c", counterScript),
		e.config("server", "sh", "-c", serverScript),
	}
}

// deadlineCtx is a context with the deadline CheckpointPod and RestorePod
// demand.
func deadlineCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// count reads counter's count (again, when it caught the file being
// rewritten).
func (e *ctrEnv) count(id string) int {
	e.t.Helper()
	for try := 0; ; try++ {
		out := e.exec(id, "cat", "/tmp/count")
		n, err := strconv.Atoi(out)
		if err == nil {
			return n
		}
		if try == 20 {
			e.t.Fatalf("count %q: %v", out, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCount waits until counter's count reaches n and returns it.
func (e *ctrEnv) waitCount(id string, n int) int {
	e.t.Helper()
	var c int
	waitUntil(e.t, fmt.Sprintf("counter's count to reach %d", n), func() error {
		if c = e.count(id); c < n {
			return fmt.Errorf("stuck at %d", c)
		}
		return nil
	})
	return c
}

func (e *ctrEnv) podIP(pod string) string {
	e.t.Helper()
	resp, err := e.d.Runtime.PodSandboxStatus(berthdtest.Ctx(e.t), &criapi.PodSandboxStatusRequest{PodSandboxId: pod})
	if err != nil {
		e.t.Fatalf("PodSandboxStatus: %v", err)
	}
	return resp.Status.GetNetwork().GetIp()
}

// token connects to the pod's port 8080 and returns what it answers.
func token(t *testing.T, ip string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), 2*time.Second)
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			b, rerr := io.ReadAll(conn)
			conn.Close()
			if s := strings.TrimSpace(string(b)); rerr == nil && s != "" {
				return s
			}
			err = rerr
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect to %s:8080: %v", ip, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *ctrEnv) state(id string) criapi.ContainerState { return e.status(id).State }

// TestCheckpointRestorePod checkpoints a pod of two containers with state
// in memory, on disk and in the kernel (a TCP listener), removes the pod,
// restores the checkpoint into a new sandbox and finds every piece of
// state again.
func TestCheckpointRestorePod(t *testing.T) {
	berthdtest.RequireCRIU(t)
	e := newCtrEnv(t)
	cfgs := e.counterConfigs()
	counter, server := e.run(cfgs[0]), e.run(cfgs[1])
	e.waitCount(counter, 10)
	tok := token(t, e.podIP(e.pod))

	out := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := e.d.Runtime.CheckpointPod(deadlineCtx(t, 2*time.Minute), &criapi.CheckpointPodRequest{
		PodSandboxId: e.pod, OutputPath: out, ContainerIds: []string{counter, server},
	})
	if err != nil {
		t.Fatalf("CheckpointPod: %v\n%s", err, e.d.Logs())
	}
	// The pod runs on, unpaused.
	atCheckpoint := e.count(counter)
	e.waitCount(counter, atCheckpoint+3)
	if got := token(t, e.podIP(e.pod)); got != tok {
		t.Fatalf("token after checkpoint %q, want %q", got, tok)
	}
	for _, name := range []string{"pod.dump", "counter/checkpoint/inventory.img", "server/rootfs-diff.tar", "counter/spec.dump"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Errorf("checkpoint: %v", err)
		}
	}
	// Gone before the restore: nothing of it is needed.
	stopRemove(t, e.d, e.pod)

	cfg := podConfig("restored")
	// The kubelet restores a pod of the same name: the same hostname
	// (and HOSTNAME in the environment, which must match).
	cfg.Hostname = e.podCfg.Hostname
	// Logs of their own: what the restored processes print must reach
	// the new containers' logs through the new shim.
	cfg.LogDirectory = filepath.Join(e.d.Dir, "restored-logs")
	cfg.Linux.CgroupParent = ""
	resp, err := e.d.Runtime.RestorePod(deadlineCtx(t, 2*time.Minute), &criapi.RestorePodRequest{
		CheckpointPath: out, Config: cfg, ContainerConfigs: cfgs,
	})
	if err != nil {
		t.Fatalf("RestorePod: %v\n%s", err, e.d.Logs())
	}
	if len(resp.RestoredContainers) != 2 {
		t.Fatalf("restored %v", resp.RestoredContainers)
	}
	ids := map[string]string{}
	for _, rc := range resp.RestoredContainers {
		ids[rc.Name] = rc.ContainerId
		if st := e.status(rc.ContainerId); st.State != criapi.ContainerState_CONTAINER_CREATED || st.Metadata.Name != rc.Name {
			t.Fatalf("restored %s is %s (%s), want created", rc.Name, st.State, st.Metadata.Name)
		}
	}
	// The checkpoint is only read.
	if _, err := os.Stat(filepath.Join(out, "counter", "checkpoint", "inventory.img")); err != nil {
		t.Fatalf("RestorePod changed the checkpoint: %v", err)
	}
	// A berthd restart between RestorePod and StartContainer loses
	// nothing: the node's monitor holds the containers to restore.
	e.d.Restart()
	for _, name := range []string{"counter", "server"} {
		if st := e.status(ids[name]); st.State != criapi.ContainerState_CONTAINER_CREATED {
			t.Fatalf("restored %s is %s after a berthd restart", name, st.State)
		}
		e.start(ids[name])
	}
	// The count goes on from where it was (a restarted shell would count
	// from 1), the files of the writable layer are back, and the listener
	// answers in the new sandbox with the token drawn before.
	if c := e.count(ids["counter"]); c < atCheckpoint-1 {
		t.Fatalf("count after restore %d, at checkpoint %d", c, atCheckpoint)
	}
	e.waitCount(ids["counter"], atCheckpoint+3)
	logPath := filepath.Join(cfg.LogDirectory, "counter.log")
	waitUntil(t, fmt.Sprintf("the restored counter to log a tick after %d", atCheckpoint), func() error {
		var last int
		for _, r := range readCRILogIfAny(t, logPath) {
			if n, ok := strings.CutPrefix(r.msg, "tick "); ok {
				last, _ = strconv.Atoi(n)
			}
		}
		if last <= atCheckpoint {
			return fmt.Errorf("last tick %d", last)
		}
		return nil
	})
	if got := e.exec(ids["counter"], "cat", "/data.txt"); got != "hello" {
		t.Fatalf("/data.txt = %q", got)
	}
	if got := e.exec(ids["server"], "cat", "/token"); got != tok {
		t.Fatalf("/token = %q, want %q", got, tok)
	}
	if got := token(t, e.podIP(resp.PodSandboxId)); got != tok {
		t.Fatalf("token after restore %q, want %q", got, tok)
	}
	// The shim reaps a restored process like any container's init (a
	// shell as pid 1 ignores SIGTERM: it is killed after the grace).
	if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: ids["counter"], Timeout: 1}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if st := e.status(ids["counter"]); st.State != criapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 128+9 || st.FinishedAt == 0 {
		t.Fatalf("stopped restored counter: %s, exit %d", st.State, st.ExitCode)
	}
	stopRemove(t, e.d, resp.PodSandboxId)
}

// TestCheckpointContainerArchive checks the archive CheckpointContainer
// writes against the layout checkpointctl and CRI-O's and containerd's
// restore read, and that the container keeps running.
func TestCheckpointContainerArchive(t *testing.T) {
	berthdtest.RequireCRIU(t)
	e := newCtrEnv(t)
	id := e.run(e.config("counter", "sh", "-c", "rm /etc/group; "+counterScript))
	e.waitCount(id, 5)
	loc := filepath.Join(t.TempDir(), "counter.tar")
	if _, err := e.d.Runtime.CheckpointContainer(berthdtest.Ctx(t), &criapi.CheckpointContainerRequest{ContainerId: id, Location: loc, Timeout: 60}); err != nil {
		t.Fatalf("CheckpointContainer: %v\n%s", err, e.d.Logs())
	}
	n := e.count(id)
	e.waitCount(id, n+3)
	if st := e.state(id); st != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container %s after checkpoint", st)
	}

	f, err := os.Open(loc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		b, _ := io.ReadAll(tr)
		files[strings.TrimSuffix(hdr.Name, "/")] = b
	}
	for _, name := range []string{"checkpoint", "checkpoint/inventory.img", "checkpoint/pstree.img", "checkpoint/descriptors.json",
		"config.dump", "spec.dump", "rootfs-diff.tar", "deleted.files", "dump.log", "stats-dump"} {
		if _, ok := files[name]; !ok {
			t.Errorf("archive has no %s", name)
		}
	}
	var cfg struct {
		ID              string    `json:"id"`
		Name            string    `json:"name"`
		RootfsImageName string    `json:"rootfsImageName"`
		RootfsImageRef  string    `json:"rootfsImageRef"`
		Runtime         string    `json:"runtime"`
		CreatedTime     time.Time `json:"createdTime"`
	}
	if err := json.Unmarshal(files["config.dump"], &cfg); err != nil {
		t.Fatalf("config.dump: %v", err)
	}
	if cfg.ID != id || cfg.Name != "counter" || cfg.RootfsImageName == "" || !strings.HasPrefix(cfg.RootfsImageRef, "sha256:") || cfg.Runtime != "runc" || cfg.CreatedTime.IsZero() {
		t.Errorf("config.dump = %+v", cfg)
	}
	var spec struct {
		Process struct{ Args []string } `json:"process"`
	}
	if err := json.Unmarshal(files["spec.dump"], &spec); err != nil || !slices.Equal(spec.Process.Args, []string{"sh", "-c", "rm /etc/group; " + counterScript}) {
		t.Errorf("spec.dump: %v, args %q", err, spec.Process.Args)
	}
	var deleted []string
	if err := json.Unmarshal(files["deleted.files"], &deleted); err != nil || !slices.Contains(deleted, "/etc/group") {
		t.Errorf("deleted.files = %s (%v), want /etc/group", files["deleted.files"], err)
	}
	diff := map[string]string{}
	dr := tar.NewReader(strings.NewReader(string(files["rootfs-diff.tar"])))
	for {
		hdr, err := dr.Next()
		if err != nil {
			break
		}
		b, _ := io.ReadAll(dr)
		diff[hdr.Name] = string(b)
	}
	if diff["data.txt"] != "hello\n" || diff["tmp/count"] == "" {
		t.Errorf("rootfs-diff.tar has data.txt %q, tmp/count %q", diff["data.txt"], diff["tmp/count"])
	}
	if _, ok := diff["etc/group"]; ok {
		t.Errorf("rootfs-diff.tar has the whiteout etc/group")
	}
}

// TestCheckpointFailuresLeaveNothing drives the failure paths of the three
// RPCs: each answers its code, leaves the pod running and unfrozen, writes
// nothing (or removes what it wrote) and leaks nothing on the node.
func TestCheckpointFailuresLeaveNothing(t *testing.T) {
	berthdtest.RequireCRIU(t)
	e := newCtrEnv(t)
	cfgs := e.counterConfigs()
	counter, server := e.run(cfgs[0]), e.run(cfgs[1])
	// A deleted file held open that is larger than CRIU's ghost file
	// limit (1 MiB): CRIU refuses to dump it.
	conn := e.run(e.config("ghost", "sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=4 2>/dev/null; exec 3</tmp/big; rm /tmp/big; touch /tmp/ready; while true; do sleep 1; done"))
	e.waitCount(counter, 3)
	e.exec(conn, "sh", "-c", "while [ ! -e /tmp/ready ]; do sleep 0.05; done")
	scope := leakcheck.ForDaemon(e.d)
	before := leakcheck.Take(t, scope)
	pods := func() int {
		resp, err := e.d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Items)
	}
	podsBefore := pods()
	out := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	ck := func(ctx context.Context, req *criapi.CheckpointPodRequest) error {
		if req.PodSandboxId == "" {
			req.PodSandboxId = e.pod
		}
		if req.OutputPath == "" {
			req.OutputPath = out
		}
		if req.ContainerIds == nil {
			req.ContainerIds = []string{counter, server}
		}
		_, err := e.d.Runtime.CheckpointPod(ctx, req)
		return err
	}
	// alive checks the pod is running and thawed, and out is empty.
	alive := func(what string) {
		t.Helper()
		waitUntil(t, what+": output_path to empty", func() error {
			if es, _ := os.ReadDir(out); len(es) != 0 {
				return fmt.Errorf("it keeps %d entries", len(es))
			}
			return nil
		})
		n := e.count(counter) // an exec into a frozen container would hang
		e.waitCount(counter, n+2)
		// The pod's network is not left locked by CRIU.
		token(t, e.podIP(e.pod))
		for _, id := range []string{counter, server, conn} {
			if st := e.state(id); st != criapi.ContainerState_CONTAINER_RUNNING {
				t.Fatalf("%s: container %s is %s", what, id, st)
			}
		}
	}
	long := func() context.Context { return deadlineCtx(t, time.Minute) }

	// Bad input.
	berthdtest.WantCode(t, ck(long(), &criapi.CheckpointPodRequest{OutputPath: filepath.Join(out, "missing")}), codes.InvalidArgument)
	berthdtest.WantCode(t, ck(long(), &criapi.CheckpointPodRequest{OutputPath: "relative"}), codes.InvalidArgument)
	berthdtest.WantCode(t, ck(long(), &criapi.CheckpointPodRequest{Options: map[string]string{"tcp-established": "true"}}), codes.InvalidArgument)
	berthdtest.WantCode(t, ck(long(), &criapi.CheckpointPodRequest{ContainerIds: []string{counter, counter}}), codes.InvalidArgument)
	berthdtest.WantCode(t, ck(ctxNoDeadline(), &criapi.CheckpointPodRequest{}), codes.InvalidArgument)
	berthdtest.WantCode(t, ck(long(), &criapi.CheckpointPodRequest{PodSandboxId: "nosuchpod"}), codes.NotFound)
	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	berthdtest.WantCode(t, ck(long(), &criapi.CheckpointPodRequest{OutputPath: full}), codes.InvalidArgument)
	_, err := e.d.Runtime.CheckpointContainer(berthdtest.Ctx(t), &criapi.CheckpointContainerRequest{ContainerId: counter, Location: filepath.Join(out, "no", "such", "dir.tar")})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	alive("bad input")

	// CRIU fails on one container: the other's capture goes too.
	err = ck(long(), &criapi.CheckpointPodRequest{ContainerIds: []string{counter, conn}})
	if err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("checkpoint of a large deleted open file: %v", err)
	}
	alive("criu failure")

	// Deadlines that end before, during and after the pause.
	for _, dl := range []time.Duration{30 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond} {
		err := ck(deadlineCtx(t, dl), &criapi.CheckpointPodRequest{})
		if err != nil && status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("deadline %s: %v", dl, err)
		}
		if err != nil {
			// The server may have finished just in time while its reply
			// came too late: a whole checkpoint (pod.dump written last)
			// is a success, not a leftover.
			time.Sleep(time.Second)
			if _, serr := os.Stat(filepath.Join(out, "pod.dump")); serr == nil {
				err = nil
			}
		}
		if err == nil {
			// Fast enough: that is fine too (a quiet machine makes it in
			// 400 ms), start over empty.
			es, _ := os.ReadDir(out)
			for _, e := range es {
				os.RemoveAll(filepath.Join(out, e.Name()))
			}
		}
		// The server finishes its undo after the client gave up.
		alive("deadline " + dl.String())
	}

	// RestorePod: bad input, and a checkpoint that does not match.
	good := filepath.Join(t.TempDir(), "good")
	if err := os.Mkdir(good, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := ck(long(), &criapi.CheckpointPodRequest{OutputPath: good}); err != nil {
		t.Fatalf("CheckpointPod: %v", err)
	}
	rcfg := podConfig("restore-fail")
	rcfg.LogDirectory = e.logDir
	rcfg.Linux.CgroupParent = ""
	restore := func(ctx context.Context, req *criapi.RestorePodRequest) error {
		if req.CheckpointPath == "" {
			req.CheckpointPath = good
		}
		if req.Config == nil {
			req.Config = rcfg
		}
		if req.ContainerConfigs == nil {
			req.ContainerConfigs = e.counterConfigs()
		}
		_, err := e.d.Runtime.RestorePod(ctx, req)
		return err
	}
	berthdtest.WantCode(t, restore(long(), &criapi.RestorePodRequest{Options: map[string]string{"x": "y"}}), codes.InvalidArgument)
	berthdtest.WantCode(t, restore(long(), &criapi.RestorePodRequest{CheckpointPath: out}), codes.InvalidArgument)
	berthdtest.WantCode(t, restore(long(), &criapi.RestorePodRequest{ContainerConfigs: e.counterConfigs()[:1]}), codes.InvalidArgument)
	berthdtest.WantCode(t, restore(long(), &criapi.RestorePodRequest{RuntimeHandler: "nosuch"}), codes.InvalidArgument)
	berthdtest.WantCode(t, restore(ctxNoDeadline(), &criapi.RestorePodRequest{}), codes.InvalidArgument)
	// Checked only once the sandbox and the first container exist: the
	// second's command differs from the checkpointed one.
	changed := e.counterConfigs()
	changed[1].Command = []string{"sh", "-c", "sleep 1000"}
	berthdtest.WantCode(t, restore(long(), &criapi.RestorePodRequest{ContainerConfigs: changed}), codes.InvalidArgument)
	if n := pods(); n != podsBefore {
		t.Fatalf("a failed restore left a pod: %d pods, %d before", n, podsBefore)
	}
	os.RemoveAll(good)
	alive("restore failures")
	time.Sleep(time.Second) // let undone work settle
	after := leakcheck.Take(t, scope)
	// runc marks a container it checkpointed with an empty file in its
	// own state dir, which goes with the container.
	after["file"] = slices.DeleteFunc(after["file"], func(f string) bool {
		return strings.Contains(f, "/runtime/runc/") && strings.HasSuffix(f, "/checkpoint")
	})
	if leaks := leakcheck.Diff(before, after); len(leaks) > 0 {
		t.Fatalf("leaked %d items:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
	// CheckpointContainer's staging dirs are gone.
	if es, _ := os.ReadDir(filepath.Join(e.d.Root, "checkpoints")); len(es) != 0 {
		t.Errorf("%d checkpoint staging dirs left", len(es))
	}
}

// ctxNoDeadline is a context without a deadline: CheckpointPod and
// RestorePod refuse it.
func ctxNoDeadline() context.Context { return context.Background() }

// TestCheckpointWithBrokenCRIU: a criu that fails `criu check` makes the
// three RPCs FailedPrecondition naming the reason, and nothing is made.
func TestCheckpointWithBrokenCRIU(t *testing.T) {
	broken := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'Error: this criu is broken for the test' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) { c.CRIU = broken }})
	e := newCtrEnvOn(t, d)
	cfgs := e.counterConfigs()
	counter := e.run(cfgs[0])
	out := t.TempDir()
	wantBroken := func(what string, err error) {
		t.Helper()
		berthdtest.WantCode(t, err, codes.FailedPrecondition)
		if !strings.Contains(err.Error(), "this criu is broken") {
			t.Errorf("%s: %v does not say why", what, err)
		}
	}
	_, err := d.Runtime.CheckpointContainer(berthdtest.Ctx(t), &criapi.CheckpointContainerRequest{ContainerId: counter, Location: filepath.Join(out, "c.tar")})
	wantBroken("CheckpointContainer", err)
	_, err = d.Runtime.CheckpointPod(deadlineCtx(t, time.Minute), &criapi.CheckpointPodRequest{PodSandboxId: e.pod, OutputPath: out, ContainerIds: []string{counter}})
	wantBroken("CheckpointPod", err)

	// A checkpoint as CheckpointPod writes it, as far as RestorePod reads
	// before it needs criu.
	ck := t.TempDir()
	write := func(name, data string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(ck, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ck, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("pod.dump", `{"version":1,"runtime":"berth","containers":[{"name":"counter","id":"x"}]}`)
	write("counter/config.dump", `{"id":"x","name":"counter","runtime":"runc"}`)
	write("counter/spec.dump", `{"ociVersion":"1.0.2"}`)
	rcfg := podConfig("restore-broken")
	rcfg.Linux.CgroupParent = ""
	_, err = d.Runtime.RestorePod(deadlineCtx(t, time.Minute), &criapi.RestorePodRequest{CheckpointPath: ck, Config: rcfg, ContainerConfigs: cfgs[:1]})
	wantBroken("RestorePod", err)
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Errorf("output_path has %d entries", len(es))
	}

	// A container checkpoint archive, restored through CreateContainer.
	archive := filepath.Join(t.TempDir(), "counter.tar")
	writeTar(t, archive, map[string]string{
		"config.dump":              `{"id":"x","name":"counter","runtime":"runc","rootfsImageName":"busybox"}`,
		"spec.dump":                `{"ociVersion":"1.0.2","process":{"args":["sh"],"cwd":"/","user":{"uid":0,"gid":0}}}`,
		"checkpoint/inventory.img": "x",
	})
	acfg := e.config("from-archive", "sh")
	acfg.Image.Image = archive
	_, err = d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: e.pod, Config: acfg, SandboxConfig: e.podCfg})
	wantBroken("CreateContainer from a checkpoint archive", err)
	if es, _ := os.ReadDir(filepath.Join(d.Root, "checkpoints")); len(es) != 0 {
		t.Errorf("%d checkpoint unpack dirs left", len(es))
	}
}

// readCRILogIfAny is readCRILog of a log that may not exist yet.
func readCRILogIfAny(t *testing.T, path string) []logRecord {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	return readCRILog(t, path)
}

// TestCheckpointRefusesSharedPIDPod: a pod sharing one PID namespace
// (berth-pause its init) cannot be restored, so it is not checkpointed:
// FailedPrecondition saying why, nothing written, the pod running.
func TestCheckpointRefusesSharedPIDPod(t *testing.T) {
	berthdtest.RequireCRIU(t)
	e := newCtrEnv(t)
	e.podCfg = podConfig("sharedpid")
	e.podCfg.LogDirectory = e.logDir
	e.podCfg.Linux.CgroupParent = ""
	e.podCfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	e.pod = runPod(t, e.d, e.podCfg)
	cfg := e.counterConfigs()[0]
	cfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	counter := e.run(cfg)
	e.waitCount(counter, 3)
	out := t.TempDir()
	_, err := e.d.Runtime.CheckpointPod(deadlineCtx(t, time.Minute), &criapi.CheckpointPodRequest{PodSandboxId: e.pod, OutputPath: out, ContainerIds: []string{counter}})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "PID namespace") {
		t.Errorf("%v does not say why", err)
	}
	_, err = e.d.Runtime.CheckpointContainer(berthdtest.Ctx(t), &criapi.CheckpointContainerRequest{ContainerId: counter, Location: filepath.Join(out, "c.tar")})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	if es, _ := os.ReadDir(out); len(es) != 0 {
		t.Errorf("output_path has %d entries", len(es))
	}
	n := e.count(counter)
	e.waitCount(counter, n+2)
}
