package jsonlite

import (
	"strconv"
	"unicode/utf8"
)

// Object appends one JSON object's members to B.
type Object struct {
	B     []byte
	start int // len(B) after the '{': the first member takes no comma
}

// BeginObject starts an object at the end of b.
func BeginObject(b []byte) Object {
	b = append(b, '{')
	return Object{B: b, start: len(b)}
}

// Key appends "key": after a comma unless it is the object's first; the
// caller appends the value to B.
func (o *Object) Key(k string) {
	if len(o.B) > o.start {
		o.B = append(o.B, ',')
	}
	o.B = AppendString(o.B, k)
	o.B = append(o.B, ':')
}

// Str appends a string member.
func (o *Object) Str(k, v string) {
	o.Key(k)
	o.B = AppendString(o.B, v)
}

// StrOmit appends a string member unless v is empty.
func (o *Object) StrOmit(k, v string) {
	if v != "" {
		o.Str(k, v)
	}
}

// Int appends an integer member.
func (o *Object) Int(k string, v int64) {
	o.Key(k)
	o.B = strconv.AppendInt(o.B, v, 10)
}

// IntOmit appends an integer member unless v is 0.
func (o *Object) IntOmit(k string, v int64) {
	if v != 0 {
		o.Int(k, v)
	}
}

// BoolOmit appends a true member; false is left out.
func (o *Object) BoolOmit(k string, v bool) {
	if v {
		o.Key(k)
		o.B = append(o.B, "true"...)
	}
}

// End closes the object and returns the bytes.
func (o *Object) End() []byte { return append(o.B, '}') }

// AppendStrings appends ss as a JSON array of strings.
func AppendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, s)
	}
	return append(b, ']')
}

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD,
// as with encoding/json (which writes it escaped); <, > and & are written
// as they are.
func AppendString(b []byte, s string) []byte {
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
