package jsonlite_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/berthcri/berth/internal/jsonlite"
	"github.com/berthcri/berth/internal/shim/proto"
)

// fuzzSeeds: what the scanner's users read (shim protocol messages and
// exit files, runc's JSON log lines and `state`), and the seeds of the
// shim protocol's fuzz targets this one replaces.
var fuzzSeeds = []string{
	`{"op":"ping"}`,
	`{"op":"create","id":"c3","create":{"bundle":"/run/b u\tndle","log_path":"/var/log/pods/x/0.log","runtime":{"binary":"runc","root":"/run/runc","options":["--systemd-cgroup","--debug"]},"stdin":true,"stdin_once":true,"terminal":true,"restore":"/b/checkpoint","criu":"/usr/sbin/criu"}}`,
	`{"op":"kill","signal":15,"all":true,"x":[{"y":"\ud83d\ude00"}]}`,
	`{"op":"\ud800x\udc00","id":"\u00e9"}`,
	`{"error":"runc \"create\" failed:\n\tno such file \u0001","kind":"not_found","ids":["a","b"]}`,
	`{"state":{"id":"c1","pid":42,"status":"exited","exit":{"version":1,"id":"c1","pid":42,"exit_code":137,"signal":9,"oom_killed":true,"exited_at":"2026-11-22T06:45:01.123456789Z"},"log_write_errors":3,"log_write_error":"no space left on device"}}`,
	`{"version":1,"id":"c1","pid":42,"exit_code":3,"exited_at":"2026-11-22T06:45:01.123456789Z"}`,
	`{"level":"error","msg":"exec: \"nope\": executable file not found in $PATH","time":"2026-11-22T06:45:01Z"}`,
	"{\n  \"ociVersion\": \"1.2.0\",\n  \"id\": \"c1\",\n  \"pid\": 42,\n  \"status\": \"running\",\n  \"bundle\": \"/b\",\n  \"annotations\": {\"a\": \"b\"}\n}",
}

// FuzzDecode is the one fuzz target of the scanner and its users: it
// never panics; StringFields (ocicli's runtime log and state reader)
// reads every object encoding/json reads, to the same strings; and the
// shim protocol's messages it accepts survive a round trip (what berthd
// writes, the monitor reads the same, and back).
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkStringFields(t, body)
		checkRequest(t, body)
		checkResponse(t, body)
		_, _ = proto.DecodeExit(body)
		_, _ = proto.DecodeKeeperMsg(body)
	})
}

func checkStringFields(t *testing.T, body []byte) {
	got := map[string]string{}
	err := jsonlite.StringFields(body, func(k, v string) { got[k] = v })
	want, ok := topLevelStrings(body)
	if !ok {
		return // encoding/json refuses it: the scanner may be laxer
	}
	if err != nil {
		t.Fatalf("%q: encoding/json reads it, StringFields: %v", body, err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("%q: StringFields read %q, encoding/json %q", body, got, want)
	}
}

// topLevelStrings is what StringFields should report, read with
// encoding/json: each top-level key whose value is a string, the last
// such value of a key given twice. Only for valid UTF-8 (encoding/json
// replaces invalid bytes, the scanner keeps them).
func topLevelStrings(body []byte) (map[string]string, bool) {
	if !utf8.Valid(body) || !json.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	out := map[string]string{}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		var s string
		if raw = bytes.TrimSpace(raw); len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
			out[key.(string)] = s
		}
	}
	return out, true
}

func checkRequest(t *testing.T, body []byte) {
	req, err := proto.DecodeRequest(body)
	if err != nil {
		return
	}
	enc := proto.AppendRequest(nil, req)
	again, err := proto.DecodeRequest(enc)
	if err != nil {
		t.Fatalf("%q: re-encoded as %s, which does not decode: %v", body, enc, err)
	}
	if !bytes.Equal(proto.AppendRequest(nil, again), enc) {
		t.Fatalf("%q: encoding is not stable: %s", body, enc)
	}
	if utf8.Valid(body) && !reflect.DeepEqual(again, req) {
		t.Fatalf("%q: decoded %+v, after a round trip %+v", body, req, again)
	}
}

func checkResponse(t *testing.T, body []byte) {
	resp, err := proto.DecodeResponse(body)
	if err != nil {
		return
	}
	enc := proto.AppendResponse(nil, resp)
	again, err := proto.DecodeResponse(enc)
	if err != nil {
		t.Fatalf("%q: re-encoded as %s, which does not decode: %v", body, enc, err)
	}
	if !bytes.Equal(proto.AppendResponse(nil, again), enc) {
		t.Fatalf("%q: encoding is not stable: %s", body, enc)
	}
}
