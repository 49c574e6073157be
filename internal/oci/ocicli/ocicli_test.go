package ocicli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	args, logPath := CreateArgs(Args("runc", "/r", []string{"--systemd-cgroup"}), "/b", "/b/pid", "", "c1")
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
