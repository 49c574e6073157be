package proto

import (
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"time"
)

// The codec: each message is a 4-byte big-endian length and a JSON object
// (decision 0300). It is written by hand, for both sides, rather than with
// encoding/json: the messages have a few fixed shapes, and encoding/json
// (its reflection, caches and imports) would cost berth-shim memory
// for nothing (decision 0303). The JSON it writes is what encoding/json
// wrote for berthd before (but for the escaping of <, >, & and invalid
// UTF-8: the same JSON either way), so shims and berthds of either
// version read each other (codec_test.go keeps those bytes).

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
	o := beginObject(b)
	o.str("op", r.Op)
	o.strOmit("id", r.ID)
	o.strOmit("dir", r.Dir)
	if c := r.Create; c != nil {
		o.key("create")
		c2 := beginObject(o.b)
		c2.str("bundle", c.Bundle)
		c2.strOmit("log_path", c.LogPath)
		c2.strOmit("log_dir", c.LogDir)
		c2.key("runtime")
		rt := beginObject(c2.b)
		rt.str("binary", c.Runtime.Binary)
		rt.str("root", c.Runtime.Root)
		if len(c.Runtime.Options) > 0 {
			rt.key("options")
			rt.b = appendStrings(rt.b, c.Runtime.Options)
		}
		c2.b = rt.end()
		c2.boolOmit("stdin", c.Stdin)
		c2.boolOmit("stdin_once", c.StdinOnce)
		c2.boolOmit("terminal", c.Terminal)
		c2.strOmit("restore", c.Restore)
		c2.strOmit("criu", c.CRIU)
		o.b = c2.end()
	}
	o.intOmit("signal", int64(r.Signal))
	o.boolOmit("all", r.All)
	o.boolOmit("stdin", r.Stdin)
	o.boolOmit("stdout", r.Stdout)
	o.boolOmit("stderr", r.Stderr)
	return o.end()
}

// AppendResponse appends r's JSON to b.
func AppendResponse(b []byte, r *Response) []byte {
	o := beginObject(b)
	o.strOmit("error", r.Error)
	o.strOmit("kind", r.Kind)
	if s := r.State; s != nil {
		o.key("state")
		so := beginObject(o.b)
		so.str("id", s.ID)
		so.int("pid", int64(s.Pid))
		so.str("status", s.Status)
		if s.Exit != nil {
			so.key("exit")
			so.b = AppendExit(so.b, s.Exit)
		}
		if s.LogWriteErrors > 0 {
			so.key("log_write_errors")
			so.b = strconv.AppendUint(so.b, s.LogWriteErrors, 10)
		}
		so.strOmit("log_write_error", s.LogWriteError)
		o.b = so.end()
	}
	if len(r.IDs) > 0 {
		o.key("ids")
		o.b = appendStrings(o.b, r.IDs)
	}
	return o.end()
}

// AppendExit appends e's JSON, the exit file format, to b. The version
// written is always ExitVersion.
func AppendExit(b []byte, e *Exit) []byte {
	o := beginObject(b)
	o.int("version", ExitVersion)
	o.str("id", e.ID)
	o.int("pid", int64(e.Pid))
	o.int("exit_code", int64(e.Code))
	o.intOmit("signal", int64(e.Signal))
	o.boolOmit("oom_killed", e.OOMKilled)
	o.key("exited_at")
	o.b = append(o.b, '"')
	o.b = e.At.AppendFormat(o.b, time.RFC3339Nano)
	o.b = append(o.b, '"')
	return o.end()
}

// DecodeRequest parses a request. Unknown keys are skipped (a newer
// berthd's); anything but one JSON object is an error.
func DecodeRequest(body []byte) (*Request, error) {
	r := &Request{}
	if err := decodeDocument(body, func(d *decoder) error { return d.request(r) }); err != nil {
		return nil, fmt.Errorf("decode request: %w", err)
	}
	return r, nil
}

// DecodeResponse parses a response. Unknown keys are skipped (a newer
// monitor's).
func DecodeResponse(body []byte) (*Response, error) {
	r := &Response{}
	if err := decodeDocument(body, func(d *decoder) error { return d.response(r) }); err != nil {
		return nil, fmt.Errorf("decode response: %w", err)
	}
	return r, nil
}

// DecodeExit parses an exit file.
func DecodeExit(body []byte) (*Exit, error) {
	e := &Exit{}
	if err := decodeDocument(body, func(d *decoder) error { return d.exit(e) }); err != nil {
		return nil, fmt.Errorf("decode exit: %w", err)
	}
	return e, nil
}

func decodeDocument(body []byte, value func(*decoder) error) error {
	d := &decoder{b: body}
	if d.peek() != '{' {
		return errSyntax
	}
	if err := value(d); err != nil {
		return err
	}
	return d.end()
}

func (d *decoder) request(r *Request) error {
	return d.object(func(key string) (err error) {
		switch key {
		case "op":
			r.Op, err = d.str()
		case "id":
			r.ID, err = d.str()
		case "dir":
			r.Dir, err = d.str()
		case "create":
			if d.null() {
				return nil
			}
			r.Create = &CreateRequest{}
			err = d.create(r.Create)
		case "signal":
			r.Signal, err = d.int()
		case "all":
			r.All, err = d.bool()
		case "stdin":
			r.Stdin, err = d.bool()
		case "stdout":
			r.Stdout, err = d.bool()
		case "stderr":
			r.Stderr, err = d.bool()
		default:
			err = d.skip()
		}
		return err
	})
}

func (d *decoder) create(c *CreateRequest) error {
	return d.object(func(key string) (err error) {
		switch key {
		case "bundle":
			c.Bundle, err = d.str()
		case "log_path":
			c.LogPath, err = d.str()
		case "log_dir":
			c.LogDir, err = d.str()
		case "runtime":
			err = d.object(func(key string) (err error) {
				switch key {
				case "binary":
					c.Runtime.Binary, err = d.str()
				case "root":
					c.Runtime.Root, err = d.str()
				case "options":
					c.Runtime.Options, err = d.strings()
				default:
					err = d.skip()
				}
				return err
			})
		case "stdin":
			c.Stdin, err = d.bool()
		case "stdin_once":
			c.StdinOnce, err = d.bool()
		case "terminal":
			c.Terminal, err = d.bool()
		case "restore":
			c.Restore, err = d.str()
		case "criu":
			c.CRIU, err = d.str()
		default:
			err = d.skip()
		}
		return err
	})
}

func (d *decoder) response(r *Response) error {
	return d.object(func(key string) (err error) {
		switch key {
		case "error":
			r.Error, err = d.str()
		case "kind":
			r.Kind, err = d.str()
		case "state":
			if d.null() {
				return nil
			}
			r.State = &State{}
			err = d.state(r.State)
		case "ids":
			r.IDs, err = d.strings()
		default:
			err = d.skip()
		}
		return err
	})
}

func (d *decoder) state(s *State) error {
	return d.object(func(key string) (err error) {
		switch key {
		case "id":
			s.ID, err = d.str()
		case "pid":
			s.Pid, err = d.int()
		case "status":
			s.Status, err = d.str()
		case "exit":
			if d.null() {
				return nil
			}
			s.Exit = &Exit{}
			err = d.exit(s.Exit)
		case "log_write_errors":
			s.LogWriteErrors, err = d.uint()
		case "log_write_error":
			s.LogWriteError, err = d.str()
		default:
			err = d.skip()
		}
		return err
	})
}

func (d *decoder) exit(e *Exit) error {
	return d.object(func(key string) (err error) {
		switch key {
		case "version":
			e.Version, err = d.int()
		case "id":
			e.ID, err = d.str()
		case "pid":
			e.Pid, err = d.int()
		case "exit_code":
			e.Code, err = d.int()
		case "signal":
			e.Signal, err = d.int()
		case "oom_killed":
			e.OOMKilled, err = d.bool()
		case "exited_at":
			var s string
			if s, err = d.str(); err == nil && s != "" {
				e.At, err = time.Parse(time.RFC3339Nano, s)
			}
		default:
			err = d.skip()
		}
		return err
	})
}
