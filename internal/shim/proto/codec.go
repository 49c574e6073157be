package proto

import (
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/berthcri/berth/internal/jsonlite"
)

// The codec: each message is a 4-byte big-endian length and a JSON object
// (decision 0300). It is written by hand, for both sides, on
// internal/jsonlite rather than with encoding/json: the messages have a
// few fixed shapes, and encoding/json (its reflection, caches and
// imports) would cost berth-shim memory for nothing (decision 0303). The
// JSON it writes is what encoding/json wrote for berthd before (but for
// the escaping of <, >, & and invalid UTF-8: the same JSON either way),
// so shims and berthds of either version read each other (codec_test.go
// keeps those bytes).

// WriteRequest writes r as one message.
func WriteRequest(w io.Writer, r *Request) error { return writeMessage(w, AppendRequest, r) }

// WriteResponse writes r as one message.
func WriteResponse(w io.Writer, r *Response) error { return writeMessage(w, AppendResponse, r) }

// ReadResponse reads one response.
func ReadResponse(r io.Reader) (*Response, error) {
	body, err := ReadMessage(r)
	if err != nil {
		return nil, err
	}
	return DecodeResponse(body)
}

func writeMessage[M any](w io.Writer, appendMsg func([]byte, *M) []byte, m *M) error {
	b := appendMsg(make([]byte, 4, 256), m)
	if len(b)-4 > MaxMessage {
		return fmt.Errorf("message of %d bytes exceeds %d", len(b)-4, MaxMessage)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	_, err := w.Write(b)
	return err
}

// ReadMessage reads one message's body (DecodeRequest parses a request's).
func ReadMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxMessage {
		return nil, fmt.Errorf("message of %d bytes exceeds %d", n, MaxMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return body, nil
}

// AppendRequest appends r's JSON to b.
func AppendRequest(b []byte, r *Request) []byte {
	o := jsonlite.BeginObject(b)
	o.Str("op", r.Op)
	o.StrOmit("id", r.ID)
	o.StrOmit("dir", r.Dir)
	if c := r.Create; c != nil {
		o.Key("create")
		c2 := jsonlite.BeginObject(o.B)
		c2.Str("bundle", c.Bundle)
		c2.StrOmit("log_path", c.LogPath)
		c2.StrOmit("log_dir", c.LogDir)
		c2.Key("runtime")
		rt := jsonlite.BeginObject(c2.B)
		rt.Str("binary", c.Runtime.Binary)
		rt.Str("root", c.Runtime.Root)
		if len(c.Runtime.Options) > 0 {
			rt.Key("options")
			rt.B = jsonlite.AppendStrings(rt.B, c.Runtime.Options)
		}
		c2.B = rt.End()
		c2.BoolOmit("stdin", c.Stdin)
		c2.BoolOmit("stdin_once", c.StdinOnce)
		c2.BoolOmit("terminal", c.Terminal)
		c2.StrOmit("restore", c.Restore)
		c2.StrOmit("criu", c.CRIU)
		o.B = c2.End()
	}
	o.IntOmit("signal", int64(r.Signal))
	o.BoolOmit("all", r.All)
	o.BoolOmit("stdin", r.Stdin)
	o.BoolOmit("stdout", r.Stdout)
	o.BoolOmit("stderr", r.Stderr)
	return o.End()
}

// AppendResponse appends r's JSON to b.
func AppendResponse(b []byte, r *Response) []byte {
	o := jsonlite.BeginObject(b)
	o.StrOmit("error", r.Error)
	o.StrOmit("kind", r.Kind)
	if s := r.State; s != nil {
		o.Key("state")
		so := jsonlite.BeginObject(o.B)
		so.Str("id", s.ID)
		so.Int("pid", int64(s.Pid))
		so.Str("status", s.Status)
		if s.Exit != nil {
			so.Key("exit")
			so.B = AppendExit(so.B, s.Exit)
		}
		if s.LogWriteErrors > 0 {
			so.Key("log_write_errors")
			so.B = strconv.AppendUint(so.B, s.LogWriteErrors, 10)
		}
		so.StrOmit("log_write_error", s.LogWriteError)
		o.B = so.End()
	}
	if len(r.IDs) > 0 {
		o.Key("ids")
		o.B = jsonlite.AppendStrings(o.B, r.IDs)
	}
	return o.End()
}

// AppendExit appends e's JSON, the exit file format, to b. The version
// written is always ExitVersion.
func AppendExit(b []byte, e *Exit) []byte {
	o := jsonlite.BeginObject(b)
	o.Int("version", ExitVersion)
	o.Str("id", e.ID)
	o.Int("pid", int64(e.Pid))
	o.Int("exit_code", int64(e.Code))
	o.IntOmit("signal", int64(e.Signal))
	o.BoolOmit("oom_killed", e.OOMKilled)
	o.Key("exited_at")
	o.B = append(o.B, '"')
	o.B = e.At.AppendFormat(o.B, time.RFC3339Nano)
	o.B = append(o.B, '"')
	return o.End()
}

// DecodeRequest parses a request. Unknown keys are skipped (a newer
// berthd's); anything but one JSON object is an error.
func DecodeRequest(body []byte) (*Request, error) {
	r := &Request{}
	if err := jsonlite.Document(body, func(d *jsonlite.Decoder) error { return requestFields(d, r) }); err != nil {
		return nil, fmt.Errorf("decode request: %w", err)
	}
	return r, nil
}

// DecodeResponse parses a response. Unknown keys are skipped (a newer
// monitor's).
func DecodeResponse(body []byte) (*Response, error) {
	r := &Response{}
	if err := jsonlite.Document(body, func(d *jsonlite.Decoder) error { return responseFields(d, r) }); err != nil {
		return nil, fmt.Errorf("decode response: %w", err)
	}
	return r, nil
}

// DecodeExit parses an exit file.
func DecodeExit(body []byte) (*Exit, error) {
	e := &Exit{}
	if err := jsonlite.Document(body, func(d *jsonlite.Decoder) error { return exitFields(d, e) }); err != nil {
		return nil, fmt.Errorf("decode exit: %w", err)
	}
	return e, nil
}

func requestFields(d *jsonlite.Decoder, r *Request) error {
	return d.Object(func(key string) (err error) {
		switch key {
		case "op":
			r.Op, err = d.Str()
		case "id":
			r.ID, err = d.Str()
		case "dir":
			r.Dir, err = d.Str()
		case "create":
			if d.Null() {
				return nil
			}
			r.Create = &CreateRequest{}
			err = createFields(d, r.Create)
		case "signal":
			r.Signal, err = d.Int()
		case "all":
			r.All, err = d.Bool()
		case "stdin":
			r.Stdin, err = d.Bool()
		case "stdout":
			r.Stdout, err = d.Bool()
		case "stderr":
			r.Stderr, err = d.Bool()
		default:
			err = d.Skip()
		}
		return err
	})
}

func createFields(d *jsonlite.Decoder, c *CreateRequest) error {
	return d.Object(func(key string) (err error) {
		switch key {
		case "bundle":
			c.Bundle, err = d.Str()
		case "log_path":
			c.LogPath, err = d.Str()
		case "log_dir":
			c.LogDir, err = d.Str()
		case "runtime":
			err = d.Object(func(key string) (err error) {
				switch key {
				case "binary":
					c.Runtime.Binary, err = d.Str()
				case "root":
					c.Runtime.Root, err = d.Str()
				case "options":
					c.Runtime.Options, err = d.Strings()
				default:
					err = d.Skip()
				}
				return err
			})
		case "stdin":
			c.Stdin, err = d.Bool()
		case "stdin_once":
			c.StdinOnce, err = d.Bool()
		case "terminal":
			c.Terminal, err = d.Bool()
		case "restore":
			c.Restore, err = d.Str()
		case "criu":
			c.CRIU, err = d.Str()
		default:
			err = d.Skip()
		}
		return err
	})
}

func responseFields(d *jsonlite.Decoder, r *Response) error {
	return d.Object(func(key string) (err error) {
		switch key {
		case "error":
			r.Error, err = d.Str()
		case "kind":
			r.Kind, err = d.Str()
		case "state":
			if d.Null() {
				return nil
			}
			r.State = &State{}
			err = stateFields(d, r.State)
		case "ids":
			r.IDs, err = d.Strings()
		default:
			err = d.Skip()
		}
		return err
	})
}

func stateFields(d *jsonlite.Decoder, s *State) error {
	return d.Object(func(key string) (err error) {
		switch key {
		case "id":
			s.ID, err = d.Str()
		case "pid":
			s.Pid, err = d.Int()
		case "status":
			s.Status, err = d.Str()
		case "exit":
			if d.Null() {
				return nil
			}
			s.Exit = &Exit{}
			err = exitFields(d, s.Exit)
		case "log_write_errors":
			s.LogWriteErrors, err = d.Uint()
		case "log_write_error":
			s.LogWriteError, err = d.Str()
		default:
			err = d.Skip()
		}
		return err
	})
}

func exitFields(d *jsonlite.Decoder, e *Exit) error {
	return d.Object(func(key string) (err error) {
		switch key {
		case "version":
			e.Version, err = d.Int()
		case "id":
			e.ID, err = d.Str()
		case "pid":
			e.Pid, err = d.Int()
		case "exit_code":
			e.Code, err = d.Int()
		case "signal":
			e.Signal, err = d.Int()
		case "oom_killed":
			e.OOMKilled, err = d.Bool()
		case "exited_at":
			var s string
			if s, err = d.Str(); err == nil && s != "" {
				e.At, err = time.Parse(time.RFC3339Nano, s)
			}
		default:
			err = d.Skip()
		}
		return err
	})
}
