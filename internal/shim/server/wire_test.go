package server

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/shim"
)

// The shim's hand-written codec must read what berthd's encoding/json
// writes and write what it reads.

func TestDecodeRequestReadsClientJSON(t *testing.T) {
	for _, req := range []shim.Request{
		{Op: shim.OpPing},
		{Op: shim.OpKill, ID: "c1", Signal: 9, All: true},
		{Op: shim.OpAttach, ID: "c\"2\\\n\u00e9\U0001F600", Stdin: true, Stdout: true, Stderr: true},
		{Op: shim.OpCreate, ID: "c3", Create: &shim.CreateRequest{
			Bundle: "/run/b u\tndle", LogPath: "/var/log/pods/x/0.log",
			Runtime: shim.Runtime{Binary: "runc", Root: "/run/runc", Options: []string{"--systemd-cgroup", "--debug"}},
			Stdin:   true, StdinOnce: true, Terminal: true,
		}},
	} {
		body, err := json.Marshal(&req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeRequest(body)
		if err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
		want := &request{op: req.Op, id: req.ID, signal: req.Signal, all: req.All, stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr}
		if c := req.Create; c != nil {
			want.create = &createRequest{bundle: c.Bundle, logPath: c.LogPath, binary: c.Runtime.Binary, root: c.Runtime.Root,
				options: c.Runtime.Options, stdin: c.Stdin, stdinOnce: c.StdinOnce, terminal: c.Terminal}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decode %s:\n got %+v\nwant %+v", body, got, want)
		}
	}
}

func TestDecodeRequestSkipsUnknownAndRejectsGarbage(t *testing.T) {
	got, err := decodeRequest([]byte(` {"future":{"a":[1,2.5e3,{"b":null}],"c":"\u0041"},"op":"state","id":"x","create":null} `))
	if err != nil || got.op != "state" || got.id != "x" || got.create != nil {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range []string{``, `{`, `{"op":}`, `{"op":"x"`, `{"op":"x"} trailing`, `{"signal":"9"}`, `{"op":"\x01"}`, `{"op":"\q"}`, `[]`} {
		if _, err := decodeRequest([]byte(bad)); err == nil {
			t.Errorf("decode %q: no error", bad)
		}
	}
}

func TestResponseAndExitReadByClientJSON(t *testing.T) {
	at := time.Date(2026, 11, 22, 6, 45, 1, 123456789, time.UTC)
	exit := &exitRecord{id: "c1", pid: 42, code: 137, signal: 9, oomKilled: true, at: at}
	for _, tc := range []struct {
		resp *response
		want shim.Response
	}{
		{&response{}, shim.Response{}},
		{&response{err: "runc \"create\" failed:\n\tno such file \x01 \xff", kind: "not_found"},
			shim.Response{Error: "runc \"create\" failed:\n\tno such file \x01 \ufffd", Kind: "not_found"}},
		{&response{ids: []string{"a", "b"}}, shim.Response{IDs: []string{"a", "b"}}},
		{&response{state: &state{id: "c1", pid: 42, status: "running"}}, shim.Response{State: &shim.State{ID: "c1", Pid: 42, Status: "running"}}},
		{&response{state: &state{id: "c1", pid: 42, status: "exited", exit: exit}}, shim.Response{State: &shim.State{ID: "c1", Pid: 42, Status: "exited",
			Exit: &shim.Exit{Version: 1, ID: "c1", Pid: 42, Code: 137, Signal: 9, OOMKilled: true, At: at}}}},
	} {
		var buf bytes.Buffer
		if err := writeResponse(&buf, tc.resp); err != nil {
			t.Fatal(err)
		}
		var got shim.Response
		if err := json.Unmarshal(buf.Bytes()[4:], &got); err != nil {
			t.Fatalf("unmarshal %s: %v", buf.Bytes()[4:], err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", buf.Bytes()[4:], got, tc.want)
		}
	}
	// The exit file berthd reads after a restart.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "exits"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeExit(dir, exit); err != nil {
		t.Fatal(err)
	}
	e, ok, err := shim.ReadExit(dir, "c1")
	if err != nil || !ok || *e != (shim.Exit{Version: 1, ID: "c1", Pid: 42, Code: 137, Signal: 9, OOMKilled: true, At: at}) {
		t.Fatalf("ReadExit = %+v, %v, %v", e, ok, err)
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
	if got, want := lastLogError(path), `exec: "nope": executable file not found in $PATH; boom`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// The log path runs for every chunk a container writes: it must not
// allocate, or a chatty container would make the shim collect garbage.
func TestLogPathAllocatesNothing(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "0.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := &container{logFile: f, attaches: map[*attachment]struct{}{}}
	lines := newLineSplitter(func(tag string, msg []byte) { c.writeLog("stdout", tag, msg) })
	fan := func(chunk []byte) { c.fanout(1, chunk) }
	r := bytes.NewReader(nil)
	chunk := []byte("one line\nand half of anoth")
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(chunk)
		if err := lines.readOnce(r, fan); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per chunk", allocs)
	}
	data, err := os.ReadFile(f.Name())
	if err != nil || !strings.Contains(string(data), " stdout F one line\n") {
		t.Fatalf("log %q, %v", data, err)
	}
}

// The housekeeping runs every few seconds for the shim's whole life: it
// must not allocate, or an idle shim would pile up garbage until a GC
// (which costs it ~0.4 MiB for good, decision 0303). It must also drop a
// parked wait whose client went away, and only that one.
func TestHousekeepingAllocatesNothingAndDropsGoneWaits(t *testing.T) {
	pair := func() (*os.File, *os.File) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fds[0]), "shim"), os.NewFile(uintptr(fds[1]), "client")
	}
	s := NewServer(t.TempDir(), t.Logf)
	c := &container{id: "c1", exited: make(chan struct{})}
	s.ctrs[c.id] = c
	stay, stayClient := pair()
	defer stayClient.Close()
	gone, goneClient := pair()
	for _, conn := range []*os.File{stay, gone} {
		if parked, err := s.wait(conn, &request{op: "wait", id: "c1"}); !parked || err != nil {
			t.Fatalf("wait: parked %v, %v", parked, err)
		}
	}
	s.trimNow() // the first read of the counter may set things up
	allocs := testing.AllocsPerRun(50, func() {
		s.reaper.reap()
		s.dropGoneWaiters()
		s.trimNow()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per housekeeping round", allocs)
	}
	goneClient.Close()
	s.dropGoneWaiters()
	if len(c.waiters) != 1 || c.waiters[0].conn != stay {
		t.Fatalf("waiters after the client left: %d", len(c.waiters))
	}
	if _, err := gone.Write([]byte{0}); err == nil {
		t.Fatal("the gone client's connection is still open")
	}
}

// The shim's memory budget depends on what it links (decision 0303).
func TestShimLinksNoHeavyPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/berthcri/berth/cmd/berth-shim").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
	}
	for _, heavy := range []string{"net", "encoding/json", "os/exec", "google.golang.org/grpc/status", "google.golang.org/protobuf/proto",
		"github.com/opencontainers/runtime-spec/specs-go", "github.com/berthcri/berth/internal/oci", "github.com/berthcri/berth/internal/shim"} {
		if deps[heavy] {
			t.Errorf("berth-shim links %s", heavy)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"op":"create","id":"c","create":{"bundle":"/b","runtime":{"binary":"runc","options":["--x"]}}}`))
	f.Add([]byte(`{"op":"kill","signal":15,"all":true,"x":[{"y":"\ud83d\ude00"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeRequest(body)
		if err != nil {
			return
		}
		// What the shim accepts, encoding/json reads the same way; keys are
		// case-sensitive here (berthd writes them lower-case) and invalid
		// UTF-8 is kept, so leave those inputs out.
		if !utf8.Valid(body) || bytes.ContainsFunc(body, unicode.IsUpper) {
			return
		}
		var r shim.Request
		if jerr := json.Unmarshal(body, &r); jerr == nil && (r.Op != req.op || r.ID != req.id) {
			t.Fatalf("%q: op/id %q/%q, encoding/json says %q/%q", body, req.op, req.id, r.Op, r.ID)
		}
	})
}
