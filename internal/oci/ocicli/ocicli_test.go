package ocicli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestError(t *testing.T) {
	exit := errors.New("exit status 1")
	err := Error([]string{"/usr/sbin/runc", "--root", "/r", "delete", "c1"}, "c1",
		[]byte(`time="2026-11-22T07:00:00Z" level=error msg="container \"c1\" does not exist"`+"\n"), exit)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `runc delete c1`) || !strings.Contains(err.Error(), `container "c1" does not exist`) {
		t.Fatalf("not found: %v", err)
	}
	err = Error([]string{"crun", "start", "c2"}, "c2", []byte("plain failure\n"), exit)
	if errors.Is(err, errdefs.ErrNotFound) || err.Error() != "crun start c2: exit status 1: plain failure" {
		t.Fatalf("plain: %v", err)
	}
	if err := Error([]string{"runc", "frobnicate"}, "c3", nil, exit); !errors.Is(err, exit) || err.Error() != "runc ? c3: exit status 1" {
		t.Fatalf("no stderr: %v", err)
	}
}

func TestLastLogErrorReadsRuntimeJSONLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runtime.log")
	log := `{"level":"info","msg":"starting","time":"2026-11-22T06:45:00Z"}
{"level":"error","msg":"exec: \"nope\": executable file not found in $PATH","time":"2026-11-22T06:45:01Z"}
not json
{"level":"fatal","msg":"boom"}
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := LastLogError(path), `exec: "nope": executable file not found in $PATH; boom`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// Moved from the monitor (TestJSONString) with `state`'s reader.
func TestJSONString(t *testing.T) {
	state := []byte("{\n  \"ociVersion\": \"1.2.0\",\n  \"id\": \"c1\",\n  \"pid\": 42,\n  \"status\": \"running\",\n  \"bundle\": \"/b\"\n}")
	if got := jsonString(state, "status"); got != "running" {
		t.Fatalf("status %q", got)
	}
	if got := jsonString(state, "pid"); got != "" {
		t.Fatalf("pid %q, want none (not a string)", got)
	}
	if got := jsonString([]byte(`{"status":"created"}`), "status"); got != "created" {
		t.Fatalf("compact: %q", got)
	}
}

// recorded is one call a recording Runner saw: its command line (a JSON
// file argument replaced by <json:its content>) and how it was to run.
type recorded struct {
	argv      string
	group     bool
	waitDelay time.Duration
	newNS     bool
	stdout    bool
}

// recorder is a Runner that records calls instead of running anything.
func recorder(t *testing.T, got *[]recorded) Runner {
	return func(_ context.Context, c *Cmd) ([]byte, error) {
		args := append([]string(nil), c.Args...)
		for i := 1; i < len(args); i++ {
			if args[i-1] == "--resources" || args[i-1] == "--process" {
				data, err := os.ReadFile(args[i])
				if err != nil {
					t.Errorf("%s file: %v", args[i-1], err)
				}
				args[i] = "<json:" + string(data) + ">"
			}
		}
		*got = append(*got, recorded{
			argv: strings.Join(args, " "), group: c.Group, waitDelay: c.WaitDelay,
			newNS: c.Sys != nil && c.Sys.Unshareflags&syscall.CLONE_NEWNS != 0, stdout: c.Stdout != nil,
		})
		return nil, nil
	}
}

// Every command line berth runs the OCI runtime with, for runc and crun,
// pinned here and built nowhere else (decision 3710): the global options
// (--root, the handler's options such as --systemd-cgroup, --criu, --log,
// --log-format) before the subcommand, then its own.
func TestCommandLines(t *testing.T) {
	bundle, root := t.TempDir(), t.TempDir()
	log, work := filepath.Join(bundle, "runtime.log"), filepath.Join(bundle, "restore-work")
	opts := []string{"--systemd-cgroup", "--debug"}
	type call func(context.Context, *Runtime) error
	cases := []struct {
		name string
		call call
		// want is the command line after the binary, "G" standing for the
		// global options every call but --version has.
		want, wantCrun string
		run            recorded // how it is run (argv left out)
	}{
		{"create", func(ctx context.Context, r *Runtime) error {
			return r.Create(ctx, "c1", CreateOpts{Bundle: bundle, PidFile: "/p", ConsoleSocket: "/s"})
		}, "G --log " + log + " --log-format json create --bundle " + bundle + " --pid-file /p --console-socket /s c1", "", recorded{}},
		{"create, no pid file or console", func(ctx context.Context, r *Runtime) error {
			return r.Create(ctx, "c1", CreateOpts{Bundle: bundle})
		}, "G --log " + log + " --log-format json create --bundle " + bundle + " c1", "", recorded{}},
		{"start", func(ctx context.Context, r *Runtime) error { return r.Start(ctx, "c1") }, "G start c1", "", recorded{}},
		{"kill all", func(ctx context.Context, r *Runtime) error { return r.Kill(ctx, "c1", syscall.SIGKILL, true) }, "G kill --all c1 9", "", recorded{}},
		{"kill init", func(ctx context.Context, r *Runtime) error { return r.Kill(ctx, "c1", syscall.SIGTERM, false) }, "G kill c1 15", "", recorded{}},
		{"delete", func(ctx context.Context, r *Runtime) error { return r.Delete(ctx, "c1", false) }, "G delete c1", "", recorded{}},
		{"delete --force", func(ctx context.Context, r *Runtime) error { return r.Delete(ctx, "c1", true) }, "G delete --force c1", "", recorded{}},
		{"state", func(ctx context.Context, r *Runtime) error { _, err := r.State(ctx, "c1"); return err }, "G state c1", "", recorded{stdout: true}},
		{"pause", func(ctx context.Context, r *Runtime) error { return r.Pause(ctx, "c1") }, "G pause c1", "", recorded{}},
		{"resume", func(ctx context.Context, r *Runtime) error { return r.Resume(ctx, "c1") }, "G resume c1", "", recorded{}},
		{"update", func(ctx context.Context, r *Runtime) error {
			return r.Update(ctx, "c1", []byte(`{"pids":{"limit":9}}`))
		},
			`G update --resources <json:{"pids":{"limit":9}}> c1`, "", recorded{}},
		{"exec", func(ctx context.Context, r *Runtime) error {
			return r.Exec(ctx, "c1", []byte(`{"args":["sh"]}`), ExecOpts{PidFile: "/p"})
		}, `G exec --process <json:{"args":["sh"]}> --pid-file /p c1`, "", recorded{}},
		{"exec detached with a console", func(ctx context.Context, r *Runtime) error {
			return r.Exec(ctx, "c1", []byte(`{}`), ExecOpts{Detach: true, PidFile: "/p", ConsoleSocket: "/s"})
		}, `G exec --process <json:{}> --detach --pid-file /p --console-socket /s c1`, "", recorded{}},
		{"checkpoint", func(ctx context.Context, r *Runtime) error {
			return r.Checkpoint(ctx, "c1", CheckpointOpts{CRIU: "/criu", ImagePath: "/img", WorkPath: "/work", LeaveRunning: true})
		}, "G --criu /criu checkpoint --image-path /img --work-path /work --leave-running c1",
			"G checkpoint --image-path /img --work-path /work --leave-running c1", recorded{group: true, waitDelay: checkpointWaitDelay}},
		{"checkpoint, default criu", func(ctx context.Context, r *Runtime) error {
			return r.Checkpoint(ctx, "c1", CheckpointOpts{ImagePath: "/img", WorkPath: "/work"})
		}, "G checkpoint --image-path /img --work-path /work c1", "", recorded{group: true, waitDelay: checkpointWaitDelay}},
		{"restore", func(ctx context.Context, r *Runtime) error {
			return r.Restore(ctx, "c2", RestoreOpts{Bundle: bundle, PidFile: "/p", ImagePath: "/img", CRIU: "/criu"})
		}, "G --criu /criu --log " + log + " --log-format json restore --detach --bundle " + bundle + " --image-path /img --work-path " + work + " --pid-file /p c2",
			"G --log " + log + " --log-format json restore --detach --bundle " + bundle + " --image-path /img --work-path " + work + " --pid-file /p c2",
			recorded{newNS: true}},
		{"features", func(ctx context.Context, r *Runtime) error { _, err := r.Features(ctx); return err }, "G features", "", recorded{stdout: true}},
		{"version", func(ctx context.Context, r *Runtime) error { _, err := r.Version(ctx); return err }, "--version", "", recorded{stdout: true}},
	}
	for _, binary := range []string{"/usr/sbin/runc", "crun"} {
		global := binary + " --root " + root + " " + strings.Join(opts, " ")
		for _, tc := range cases {
			t.Run(filepath.Base(binary)+"/"+tc.name, func(t *testing.T) {
				var got []recorded
				r := &Runtime{Binary: binary, Root: root, Options: opts, Run: recorder(t, &got)}
				if err := tc.call(context.Background(), r); err != nil {
					t.Fatal(err)
				}
				want := tc.want
				if tc.wantCrun != "" && binary == "crun" {
					want = tc.wantCrun
				}
				if strings.HasPrefix(want, "G ") {
					want = global + want[1:]
				} else {
					want = binary + " " + want
				}
				if len(got) != 1 || got[0].argv != want {
					t.Fatalf("got %+v\nwant %s", got, want)
				}
				run := got[0]
				run.argv = ""
				if run != tc.run {
					t.Fatalf("run as %+v, want %+v", run, tc.run)
				}
			})
		}
	}
}

// A container the runtime does not know: Delete is done, the rest say
// NotFound; a call ctx ended says so.
func TestCallErrors(t *testing.T) {
	fail := func(context.Context, *Cmd) ([]byte, error) {
		return []byte(`level=error msg="container does not exist"`), errors.New("exit status 1")
	}
	r := &Runtime{Binary: "runc", Root: t.TempDir(), Run: fail}
	ctx := context.Background()
	if err := r.Delete(ctx, "c3", false); err != nil {
		t.Fatalf("delete of an unknown container: %v", err)
	}
	if err := r.Start(ctx, "c3"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "runc start c3") {
		t.Fatalf("start of an unknown container: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	r.Run = func(context.Context, *Cmd) ([]byte, error) { return nil, errors.New("signal: killed") }
	if err := r.Checkpoint(cancelled, "c4", CheckpointOpts{}); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("checkpoint cut by its context: %v", err)
	}
}
