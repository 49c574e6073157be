package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/berthcri/berth/internal/shim/proto"
)

// The shim speaks the JSON of package shim's Request, Response and Exit
// with this small codec instead of encoding/json: the messages have a few
// fixed shapes, and encoding/json (with reflect caches and its imports)
// would cost every pod's shim memory for nothing.

// request is shim.Request.
type request struct {
	op, id                     string
	create                     *createRequest
	signal                     int
	all, stdin, stdout, stderr bool
}

// createRequest is shim.CreateRequest.
type createRequest struct {
	bundle, logPath            string
	binary, root               string
	options                    []string
	stdin, stdinOnce, terminal bool
}

// exitRecord is shim.Exit.
type exitRecord struct {
	id                string
	pid, code, signal int
	oomKilled         bool
	at                time.Time
}

// state is shim.State.
type state struct {
	id     string
	pid    int
	status string
	exit   *exitRecord
}

// response is shim.Response.
type response struct {
	err, kind string
	state     *state
	ids       []string
}

// readMessage reads one length-prefixed message body.
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > proto.MaxMessage {
		return nil, fmt.Errorf("message of %d bytes exceeds %d", n, proto.MaxMessage)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return body, nil
}

// writeResponse writes r as one length-prefixed message.
func writeResponse(w io.Writer, r *response) error {
	b := make([]byte, 4, 256)
	b = appendResponse(b, r)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	_, err := w.Write(b)
	return err
}

func appendResponse(b []byte, r *response) []byte {
	b = append(b, '{')
	n := len(b)
	if r.err != "" {
		b = appendKey(b, n, "error")
		b = appendString(b, r.err)
	}
	if r.kind != "" {
		b = appendKey(b, n, "kind")
		b = appendString(b, r.kind)
	}
	if r.state != nil {
		b = appendKey(b, n, "state")
		b = append(b, `{"id":`...)
		b = appendString(b, r.state.id)
		b = append(b, `,"pid":`...)
		b = strconv.AppendInt(b, int64(r.state.pid), 10)
		b = append(b, `,"status":`...)
		b = appendString(b, r.state.status)
		if r.state.exit != nil {
			b = append(b, `,"exit":`...)
			b = appendExit(b, r.state.exit)
		}
		b = append(b, '}')
	}
	if len(r.ids) > 0 {
		b = appendKey(b, n, "ids")
		b = append(b, '[')
		for i, id := range r.ids {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, id)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendKey appends "key": after a comma unless it is the object's first.
func appendKey(b []byte, start int, key string) []byte {
	if len(b) > start {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, key...)
	return append(b, '"', ':')
}

// appendExit appends e in the exit file format (shim.Exit).
func appendExit(b []byte, e *exitRecord) []byte {
	b = append(b, `{"version":`...)
	b = strconv.AppendInt(b, proto.ExitVersion, 10)
	b = append(b, `,"id":`...)
	b = appendString(b, e.id)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(e.pid), 10)
	b = append(b, `,"exit_code":`...)
	b = strconv.AppendInt(b, int64(e.code), 10)
	if e.signal != 0 {
		b = append(b, `,"signal":`...)
		b = strconv.AppendInt(b, int64(e.signal), 10)
	}
	if e.oomKilled {
		b = append(b, `,"oom_killed":true`...)
	}
	b = append(b, `,"exited_at":"`...)
	b = e.at.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"', '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as with encoding/json.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

var errSyntax = errors.New("malformed JSON")

// decoder reads the few JSON shapes the shim receives: objects of strings,
// integers, booleans, string arrays and nested objects; any other value is
// skipped.
type decoder struct {
	b []byte
	i int
}

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *decoder) literal(lit string) bool {
	d.ws()
	if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// null consumes a null and reports whether there was one.
func (d *decoder) null() bool { return d.peek() == 'n' && d.literal("null") }

// object calls field for each key; field must consume the value.
func (d *decoder) object(field func(key string) error) error {
	if d.null() {
		return nil
	}
	if d.peek() != '{' {
		return errSyntax
	}
	d.i++
	if d.peek() == '}' {
		d.i++
		return nil
	}
	for {
		key, err := d.str()
		if err != nil {
			return err
		}
		if d.peek() != ':' {
			return errSyntax
		}
		d.i++
		if err := field(key); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return errSyntax
		}
	}
}

func (d *decoder) str() (string, error) {
	if d.null() {
		return "", nil
	}
	if d.peek() != '"' {
		return "", errSyntax
	}
	d.i++
	start := d.i
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			s := string(d.b[start:d.i])
			d.i++
			return s, nil
		case c == '\\':
			return d.escapedStr(start)
		case c < 0x20:
			return "", errSyntax
		default:
			d.i++
		}
	}
	return "", errSyntax
}

// escapedStr finishes a string that has escapes, from its first byte.
func (d *decoder) escapedStr(start int) (string, error) {
	out := append([]byte(nil), d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return string(out), nil
		case c < 0x20:
			return "", errSyntax
		case c != '\\':
			out = append(out, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.b) {
			return "", errSyntax
		}
		e := d.b[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := d.hex4()
			if !ok {
				return "", errSyntax
			}
			if r >= 0xd800 && r < 0xdc00 {
				// A surrogate pair, when the low half follows.
				if d.i+1 < len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
					save := d.i
					d.i += 2
					if lo, ok := d.hex4(); ok && lo >= 0xdc00 && lo < 0xe000 {
						r = (r-0xd800)<<10 + (lo - 0xdc00) + 0x10000
					} else {
						d.i = save
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			} else if r >= 0xdc00 && r < 0xe000 {
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", errSyntax
		}
	}
	return "", errSyntax
}

func (d *decoder) hex4() (rune, bool) {
	if len(d.b)-d.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range d.b[d.i : d.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	d.i += 4
	return r, true
}

// number returns the raw text of a number.
func (d *decoder) number() ([]byte, error) {
	d.ws()
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			d.i++
			continue
		}
		break
	}
	if d.i == start {
		return nil, errSyntax
	}
	return d.b[start:d.i], nil
}

func (d *decoder) int() (int, error) {
	if d.null() {
		return 0, nil
	}
	num, err := d.number()
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(num))
	if err != nil {
		return 0, errSyntax
	}
	return n, nil
}

func (d *decoder) bool() (bool, error) {
	switch {
	case d.literal("true"):
		return true, nil
	case d.literal("false"), d.null():
		return false, nil
	}
	return false, errSyntax
}

func (d *decoder) strings() ([]string, error) {
	if d.null() {
		return nil, nil
	}
	if d.peek() != '[' {
		return nil, errSyntax
	}
	d.i++
	var out []string
	if d.peek() == ']' {
		d.i++
		return out, nil
	}
	for {
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return out, nil
		default:
			return nil, errSyntax
		}
	}
}

// skip consumes any value.
func (d *decoder) skip() error {
	switch c := d.peek(); {
	case c == '{':
		return d.object(func(string) error { return d.skip() })
	case c == '[':
		d.i++
		if d.peek() == ']' {
			d.i++
			return nil
		}
		for {
			if err := d.skip(); err != nil {
				return err
			}
			switch d.peek() {
			case ',':
				d.i++
			case ']':
				d.i++
				return nil
			default:
				return errSyntax
			}
		}
	case c == '"':
		_, err := d.str()
		return err
	case c == 't' || c == 'f' || c == 'n':
		if d.literal("true") || d.literal("false") || d.literal("null") {
			return nil
		}
		return errSyntax
	default:
		_, err := d.number()
		return err
	}
}

// end checks that only whitespace follows the value.
func (d *decoder) end() error {
	if d.ws(); d.i != len(d.b) {
		return errSyntax
	}
	return nil
}

// decodeRequest parses a shim.Request.
func decodeRequest(body []byte) (*request, error) {
	d := &decoder{b: body}
	r := &request{}
	err := d.object(func(key string) (err error) {
		switch key {
		case "op":
			r.op, err = d.str()
		case "id":
			r.id, err = d.str()
		case "signal":
			r.signal, err = d.int()
		case "all":
			r.all, err = d.bool()
		case "stdin":
			r.stdin, err = d.bool()
		case "stdout":
			r.stdout, err = d.bool()
		case "stderr":
			r.stderr, err = d.bool()
		case "create":
			if d.null() {
				return nil
			}
			r.create = &createRequest{}
			err = d.decodeCreate(r.create)
		default:
			err = d.skip()
		}
		return err
	})
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return nil, fmt.Errorf("decode request: %w", err)
	}
	return r, nil
}

func (d *decoder) decodeCreate(c *createRequest) error {
	return d.object(func(key string) (err error) {
		switch key {
		case "bundle":
			c.bundle, err = d.str()
		case "log_path":
			c.logPath, err = d.str()
		case "stdin":
			c.stdin, err = d.bool()
		case "stdin_once":
			c.stdinOnce, err = d.bool()
		case "terminal":
			c.terminal, err = d.bool()
		case "runtime":
			err = d.object(func(key string) (err error) {
				switch key {
				case "binary":
					c.binary, err = d.str()
				case "root":
					c.root, err = d.str()
				case "options":
					c.options, err = d.strings()
				default:
					err = d.skip()
				}
				return err
			})
		default:
			err = d.skip()
		}
		return err
	})
}
