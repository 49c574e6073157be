package ocicli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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

func TestCreateArgs(t *testing.T) {
	args, logPath := createArgs(Args("runc", "/r", []string{"--systemd-cgroup"}), "/b", "/b/pid", "", "c1")
	want := "runc --root /r --systemd-cgroup --log /b/runtime.log --log-format json create --bundle /b --pid-file /b/pid c1"
	if strings.Join(args, " ") != want || logPath != "/b/runtime.log" {
		t.Fatalf("got %q %q", args, logPath)
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

// Moved from shim/proto (TestStringFields) with the runtime's JSON log
// reader.
func TestStringFields(t *testing.T) {
	got := map[string]string{}
	err := stringFields([]byte(`{"level":"error","n":1,"msg":"exec: \"nope\"","x":{"msg":"inner"}}`), func(k, v string) { got[k] = v })
	if err != nil || len(got) != 2 || got["level"] != "error" || got["msg"] != `exec: "nope"` {
		t.Fatalf("%v, %v", got, err)
	}
	if stringFields([]byte(`not json`), func(string, string) {}) == nil {
		t.Fatal("no error for garbage")
	}
}

func TestStringFieldsEscapes(t *testing.T) {
	got := map[string]string{}
	err := stringFields([]byte(`{"a":"\u00e9\ud83d\ude00\/\t","b":[1,{"c":"}"}],"d":null,"e":"x"}`), func(k, v string) { got[k] = v })
	if err != nil || got["a"] != "\u00e9\U0001F600/\t" || got["e"] != "x" || len(got) != 2 {
		t.Fatalf("%q, %v", got, err)
	}
	for _, bad := range []string{`{"a":"open`, `{"a" "b"}`, `{"a":"b"} x`, `{"a":"\q"}`, `{"a":1`} {
		if stringFields([]byte(bad), func(string, string) {}) == nil {
			t.Errorf("no error for %s", bad)
		}
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

// The command lines the one seam builds, through a Runner that records
// them instead of running anything.
func TestRuntimeCommandLines(t *testing.T) {
	var got []string
	var notFound bool
	r := &Runtime{Binary: "runc", Root: t.TempDir(), Options: []string{"--systemd-cgroup"},
		Run: func(_ context.Context, c *Cmd) ([]byte, error) {
			got = append(got, c.ID+": "+strings.Join(c.Args[3:], " "))
			if notFound {
				return []byte(`level=error msg="container does not exist"`), errors.New("exit status 1")
			}
			return nil, nil
		}}
	ctx := context.Background()
	bundle := t.TempDir()
	if err := r.Create(ctx, "c1", CreateOpts{Bundle: bundle, PidFile: "/p", ConsoleSocket: "/s"}); err != nil {
		t.Fatal(err)
	}
	_ = r.Start(ctx, "c1")
	_ = r.Kill(ctx, "c1", syscall.SIGKILL, true)
	_ = r.Kill(ctx, "c1", syscall.SIGTERM, false)
	_ = r.Delete(ctx, "c1", true)
	if err := r.Restore(ctx, "c2", RestoreOpts{Bundle: bundle, PidFile: "/p", ImagePath: "/img", CRIU: "/criu"}); err != nil {
		t.Fatal(err)
	}
	notFound = true
	if err := r.Delete(ctx, "c3", false); err != nil {
		t.Fatalf("delete of an unknown container: %v", err)
	}
	if err := r.Start(ctx, "c3"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("start of an unknown container: %v", err)
	}
	log := filepath.Join(bundle, "runtime.log")
	want := []string{
		"c1: --systemd-cgroup --log " + log + " --log-format json create --bundle " + bundle + " --pid-file /p --console-socket /s c1",
		"c1: --systemd-cgroup start c1",
		"c1: --systemd-cgroup kill --all c1 9",
		"c1: --systemd-cgroup kill c1 15",
		"c1: --systemd-cgroup delete --force c1",
		"c2: --systemd-cgroup --criu /criu --log " + log + " --log-format json restore --detach --bundle " + bundle +
			" --image-path /img --work-path " + filepath.Join(bundle, "restore-work") + " --pid-file /p c2",
		"c3: --systemd-cgroup delete c3",
		"c3: --systemd-cgroup start c3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
