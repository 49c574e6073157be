package proto

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/berthcri/berth/internal/errdefs"
)

var testAt = time.Date(2026, 11, 22, 6, 45, 1, 123456789, time.UTC)

// The bytes each side wrote before the codec was shared (berthd with
// encoding/json, the shim with its own codec). berth-shim outlives the berthd
// that started it, so an upgraded berthd talks to a monitor of the
// previous version and reads its exit files: these bytes must still mean the
// same, both ways.
var wireRequests = []struct {
	json string
	req  Request
}{
	{`{"op":"ping"}`, Request{Op: OpPing}},
	{`{"op":"kill","id":"c1","signal":9,"all":true}`, Request{Op: OpKill, ID: "c1", Signal: 9, All: true}},
	{`{"op":"attach","id":"c\"2\\\né😀","stdin":true,"stdout":true,"stderr":true}`,
		Request{Op: OpAttach, ID: "c\"2\\\n\u00e9\U0001F600", Stdin: true, Stdout: true, Stderr: true}},
	{`{"op":"create","id":"c3","create":{"bundle":"/run/b u\tndle","log_path":"/var/log/pods/x/0.log","runtime":{"binary":"runc","root":"/run/runc","options":["--systemd-cgroup","--debug"]},"stdin":true,"stdin_once":true,"terminal":true}}`,
		Request{Op: OpCreate, ID: "c3", Create: &CreateRequest{Bundle: "/run/b u\tndle", LogPath: "/var/log/pods/x/0.log",
			Runtime: Runtime{Binary: "runc", Root: "/run/runc", Options: []string{"--systemd-cgroup", "--debug"}}, Stdin: true, StdinOnce: true, Terminal: true}}},
	{`{"op":"create","id":"c4","create":{"bundle":"/b","runtime":{"binary":"crun","root":"/r"}}}`,
		Request{Op: OpCreate, ID: "c4", Create: &CreateRequest{Bundle: "/b", Runtime: Runtime{Binary: "crun", Root: "/r"}}}},
	// Added since: a berthd of the previous version leaves them out.
	{`{"op":"create","id":"c5","create":{"bundle":"/b","runtime":{"binary":"runc","root":"/r"},"restore":"/b/checkpoint","criu":"/usr/sbin/criu"}}`,
		Request{Op: OpCreate, ID: "c5", Create: &CreateRequest{Bundle: "/b", Runtime: Runtime{Binary: "runc", Root: "/r"}, Restore: "/b/checkpoint", CRIU: "/usr/sbin/criu"}}},
	{`{"op":"create","id":"c6","create":{"bundle":"/b","log_path":"/var/log/pods/x/c/0.log","log_dir":"/var/log/pods/x","runtime":{"binary":"runc","root":"/r"}}}`,
		Request{Op: OpCreate, ID: "c6", Create: &CreateRequest{Bundle: "/b", LogPath: "/var/log/pods/x/c/0.log", LogDir: "/var/log/pods/x", Runtime: Runtime{Binary: "runc", Root: "/r"}}}},
}

var wireResponses = []struct {
	json string
	resp Response
}{
	{`{}`, Response{}},
	{`{"error":"runc \"create\" failed:\n\tno such file \u0001","kind":"not_found"}`,
		Response{Error: "runc \"create\" failed:\n\tno such file \x01", Kind: KindNotFound}},
	{`{"ids":["a","b"]}`, Response{IDs: []string{"a", "b"}}},
	{`{"state":{"id":"c1","pid":42,"status":"running"}}`, Response{State: &State{ID: "c1", Pid: 42, Status: StatusRunning}}},
	{`{"state":{"id":"c1","pid":42,"status":"exited","exit":{"version":1,"id":"c1","pid":42,"exit_code":137,"signal":9,"oom_killed":true,"exited_at":"2026-11-22T06:45:01.123456789Z"}}}`,
		Response{State: &State{ID: "c1", Pid: 42, Status: StatusExited,
			Exit: &Exit{Version: 1, ID: "c1", Pid: 42, Code: 137, Signal: 9, OOMKilled: true, At: testAt}}}},
	// Added since: a monitor of the previous version leaves them out.
	{`{"state":{"id":"c1","pid":42,"status":"running","log_write_errors":3,"log_write_error":"no space left on device"}}`,
		Response{State: &State{ID: "c1", Pid: 42, Status: StatusRunning, LogWriteErrors: 3, LogWriteError: "no space left on device"}}},
	{`{"error":"container c1: already exists","kind":"already_exists"}`,
		Response{Error: "container c1: already exists", Kind: KindAlreadyExists}},
}

const wireExit = `{"version":1,"id":"c1","pid":42,"exit_code":3,"exited_at":"2026-11-22T06:45:01.123456789Z"}`

func TestRequestsKeepTheirWireForm(t *testing.T) {
	for _, tc := range wireRequests {
		if got := string(AppendRequest(nil, &tc.req)); got != tc.json {
			t.Errorf("encode %+v:\n got %s\nwant %s", tc.req, got, tc.json)
		}
		got, err := DecodeRequest([]byte(tc.json))
		if err != nil || !reflect.DeepEqual(*got, tc.req) {
			t.Errorf("decode %s: %+v, %v", tc.json, got, err)
		}
	}
}

func TestResponsesKeepTheirWireForm(t *testing.T) {
	for _, tc := range wireResponses {
		if got := string(AppendResponse(nil, &tc.resp)); got != tc.json {
			t.Errorf("encode %+v:\n got %s\nwant %s", tc.resp, got, tc.json)
		}
		got, err := DecodeResponse([]byte(tc.json))
		if err != nil || !reflect.DeepEqual(*got, tc.resp) {
			t.Errorf("decode %s: %+v, %v", tc.json, got, err)
		}
	}
}

func TestExitFileKeepsItsWireForm(t *testing.T) {
	want := Exit{Version: 1, ID: "c1", Pid: 42, Code: 3, At: testAt}
	if got := string(AppendExit(nil, &want)); got != wireExit {
		t.Errorf("encode:\n got %s\nwant %s", got, wireExit)
	}
	got, err := DecodeExit([]byte(wireExit))
	if err != nil || *got != want {
		t.Errorf("decode: %+v, %v", got, err)
	}
	// Unknown is berthd's own and never written.
	if got := string(AppendExit(nil, &Exit{Version: 1, ID: "c1", Pid: 42, Code: 3, At: testAt, Unknown: "lost"})); got != wireExit {
		t.Errorf("Unknown encoded: %s", got)
	}
}

// Whatever either side writes, the other reads back unchanged, through the
// length-prefixed framing too.
func TestMessagesRoundTrip(t *testing.T) {
	odd := "tab\t nl\n quote\" backslash\\ ctl\x01\x1f del\x7f é 😀 <&>"
	reqs := []Request{
		{},
		{Op: OpState, ID: odd},
		{Op: OpKill, ID: "c", Signal: -1},
		{Op: OpCreate, ID: "c", Create: &CreateRequest{Bundle: odd, Runtime: Runtime{Binary: odd, Options: []string{"", odd}}}},
	}
	for _, req := range reqs {
		var buf bytes.Buffer
		if err := WriteRequest(&buf, &req); err != nil {
			t.Fatal(err)
		}
		body, err := ReadMessage(&buf)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRequest(body)
		if err != nil || !reflect.DeepEqual(*got, req) {
			t.Errorf("round trip of %+v: %+v, %v", req, got, err)
		}
	}
	resps := []Response{
		{Error: odd, Kind: KindInvalidArgument},
		{IDs: []string{odd, ""}},
		{State: &State{ID: odd, Status: StatusCreated, LogWriteErrors: 1<<64 - 1, LogWriteError: odd}},
		{State: &State{ID: "c", Pid: 1, Status: StatusExited, Exit: &Exit{Version: 1, ID: "c", Code: -1, At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("", -3600))}}},
	}
	for _, resp := range resps {
		var buf bytes.Buffer
		if err := WriteResponse(&buf, &resp); err != nil {
			t.Fatal(err)
		}
		got, err := ReadResponse(&buf)
		if err != nil {
			t.Fatalf("%+v: %v", resp, err)
		}
		if got.State != nil && got.State.Exit != nil && got.State.Exit.At.Equal(resp.State.Exit.At) {
			got.State.Exit.At = resp.State.Exit.At // same instant; the zone is a fresh *Location
		}
		if !reflect.DeepEqual(*got, resp) {
			t.Errorf("round trip of %+v: %+v", resp, got)
		}
	}
}

func TestInvalidUTF8BecomesReplacementChar(t *testing.T) {
	b := AppendResponse(nil, &Response{Error: "bad \xff byte"})
	got, err := DecodeResponse(b)
	if err != nil || got.Error != "bad \ufffd byte" {
		t.Fatalf("%s: %+v, %v", b, got, err)
	}
}

func TestDecodeSkipsUnknownAndRejectsGarbage(t *testing.T) {
	got, err := DecodeRequest([]byte(` {"future":{"a":[1,2.5e3,{"b":null}],"c":"\u0041"},"op":"state","id":"x","create":null} `))
	if err != nil || got.Op != "state" || got.ID != "x" || got.Create != nil {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range []string{``, `{`, `{"op":}`, `{"op":"x"`, `{"op":"x"} trailing`, `{"signal":"9"}`, `{"op":"\x01"}`, `{"op":"\q"}`, `[]`, `"op"`, `null`} {
		if _, err := DecodeRequest([]byte(bad)); err == nil {
			t.Errorf("decode request %q: no error", bad)
		}
	}
	for _, bad := range []string{`{"state":{"pid":"1"}}`, `{"ids":"a"}`, `{"state":{"exit":{"exited_at":"yesterday"}}}`, `{"state":{"log_write_errors":-1}}`} {
		if _, err := DecodeResponse([]byte(bad)); err == nil {
			t.Errorf("decode response %q: no error", bad)
		}
	}
}

func TestReadMessageRejectsOversize(t *testing.T) {
	hdr := []byte{0x7f, 0xff, 0xff, 0xff}
	if _, err := ReadMessage(bytes.NewReader(hdr)); err == nil {
		t.Fatal("no error for a 2 GiB message")
	}
}

// Every kind crosses the wire as the errdefs error it came from; this is
// the table the two sides once kept apart (AlreadyExists was missing on
// the shim's side).
func TestErrorKindsRoundTrip(t *testing.T) {
	for _, kind := range []error{errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrInvalidArgument} {
		sent := fmt.Errorf("container c1: %w", kind)
		got, err := DecodeResponse(AppendResponse(nil, ErrorResponse(sent)))
		if err != nil {
			t.Fatal(err)
		}
		if rerr := got.Err(); !errors.Is(rerr, kind) || rerr.Error() != sent.Error()+": "+kind.Error() {
			t.Errorf("%v came back as %v", sent, rerr)
		}
	}
	if err := ErrorResponse(errors.New("plain")).Err(); err == nil || err.Error() != "plain" {
		t.Errorf("plain error came back as %v", err)
	}
	if err := (&Response{}).Err(); err != nil {
		t.Errorf("success carries %v", err)
	}
}

// What either side accepts survives a round trip (what berthd writes, the
// monitor reads the same, and back): the wire forms, and the inputs the
// shim protocol's own fuzz targets once found (invalid UTF-8 in a
// string). The fuzzing itself is internal/jsonlite's FuzzDecode, which
// checks the same of whatever it generates.
func TestDecodedMessagesReencodeStably(t *testing.T) {
	bodies := []string{wireExit, "{\"op\":\"\xff\"}", "{\"error\":\"\xf4\"}",
		`{"op":"kill","signal":15,"all":true,"x":[{"y":"\ud83d\ude00"}]}`, `{"op":"\ud800x\udc00","id":"\u00e9"}`}
	for _, tc := range wireRequests {
		bodies = append(bodies, tc.json)
	}
	for _, tc := range wireResponses {
		bodies = append(bodies, tc.json)
	}
	for _, body := range bodies {
		if req, err := DecodeRequest([]byte(body)); err == nil {
			enc := AppendRequest(nil, req)
			again, err := DecodeRequest(enc)
			if err != nil || !bytes.Equal(AppendRequest(nil, again), enc) {
				t.Errorf("request %q: re-encoded as %s: %+v, %v", body, enc, again, err)
			}
			if utf8.ValidString(body) && !reflect.DeepEqual(again, req) {
				t.Errorf("request %q: decoded %+v, after a round trip %+v", body, req, again)
			}
		}
		if resp, err := DecodeResponse([]byte(body)); err == nil {
			enc := AppendResponse(nil, resp)
			again, err := DecodeResponse(enc)
			if err != nil || !bytes.Equal(AppendResponse(nil, again), enc) {
				t.Errorf("response %q: re-encoded as %s: %+v, %v", body, enc, again, err)
			}
		}
	}
	if req, err := DecodeRequest([]byte("{\"op\":\"\xff\"}")); err != nil || req.Op != "\xff" {
		t.Errorf("invalid UTF-8 in a request: %+v, %v", req, err)
	}
}

// The keeper's messages survive the codec, and a message from a newer
// peer (an unknown key) still decodes.
func TestKeeperMsgRoundTrip(t *testing.T) {
	in := &KeeperMsg{Op: KeeperAdopt, ID: "c1", Dir: "/run/berth/shims/p1", Pid: 42, Running: true, Exited: true, Status: 0,
		Streams: "stdout,stderr,stdin", Create: string(AppendRequest(nil, &Request{Op: OpCreate, ID: "c1", Create: &CreateRequest{Bundle: "/b", Runtime: Runtime{Binary: "runc"}}}))}
	out, err := DecodeKeeperMsg(AppendKeeperMsg(nil, in))
	if err != nil {
		t.Fatal(err)
	}
	if *out != *in {
		t.Fatalf("round trip: %+v, want %+v", out, in)
	}
	if names := out.StreamNames(); len(names) != 3 || names[2] != "stdin" {
		t.Fatalf("streams %q", names)
	}
	req, err := DecodeRequest([]byte(out.Create))
	if err != nil || req.Create.Bundle != "/b" {
		t.Fatalf("create request: %+v, %v", req, err)
	}
	m, err := DecodeKeeperMsg([]byte(`{"op":"exit","pid":7,"exited":true,"status":256,"future":[1,{"a":2}]}`))
	if err != nil || m.Pid != 7 || m.Status != 256 {
		t.Fatalf("newer message: %+v, %v", m, err)
	}
	for _, bad := range []string{``, `{}`, `{"op":3}`, `[]`} {
		if _, err := DecodeKeeperMsg([]byte(bad)); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}
