package proto

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// A small JSON writer and reader for the protocol's few shapes: objects of
// strings, integers, booleans, string arrays and nested objects. Reading
// skips any other value, so a newer peer may add keys.

// objectWriter appends one JSON object's members to b.
type objectWriter struct {
	b     []byte
	start int // len(b) after the '{': the first member takes no comma
}

func beginObject(b []byte) objectWriter {
	b = append(b, '{')
	return objectWriter{b: b, start: len(b)}
}

// key appends "key": after a comma unless it is the object's first.
func (o *objectWriter) key(k string) {
	if len(o.b) > o.start {
		o.b = append(o.b, ',')
	}
	o.b = append(o.b, '"')
	o.b = append(o.b, k...)
	o.b = append(o.b, '"', ':')
}

func (o *objectWriter) str(k, v string) {
	o.key(k)
	o.b = appendString(o.b, v)
}

func (o *objectWriter) strOmit(k, v string) {
	if v != "" {
		o.str(k, v)
	}
}

func (o *objectWriter) int(k string, v int64) {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

func (o *objectWriter) intOmit(k string, v int64) {
	if v != 0 {
		o.int(k, v)
	}
}

func (o *objectWriter) boolOmit(k string, v bool) {
	if v {
		o.key(k)
		o.b = append(o.b, "true"...)
	}
}

func (o *objectWriter) end() []byte { return append(o.b, '}') }

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as with encoding/json (which writes it escaped).
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
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

var errSyntax = errors.New("malformed JSON")

// decoder reads the few JSON shapes the protocol carries: objects of strings,
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

func (d *decoder) uint() (uint64, error) {
	if d.null() {
		return 0, nil
	}
	num, err := d.number()
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(num), 10, 64)
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
