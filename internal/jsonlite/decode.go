// Package jsonlite reads and writes the few JSON shapes berth's
// hand-written codecs carry (objects of strings, integers, booleans,
// string arrays and nested objects), without encoding/json: berth-shim
// links neither its reflection nor its caches (decision 0303). The shim
// protocol's codec (internal/shim/proto) and the OCI runtime's JSON log and
// `state` reader (internal/oci/ocicli) are its users. Reading skips any
// value a reader does not ask for, so a newer writer may add keys. It
// imports only errors, strconv and unicode/utf8.
package jsonlite

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// ErrSyntax is what every malformed input returns.
var ErrSyntax = errors.New("malformed JSON")

// maxDepth bounds the nesting Skip steps through, as encoding/json's
// scanner does (10000), so a hostile document cannot grow the stack
// without bound.
const maxDepth = 10000

// Decoder reads one JSON document from a byte slice.
type Decoder struct {
	b     []byte
	i     int
	depth int
}

// NewDecoder returns a decoder of b.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

// Document decodes body, which must be one JSON object and nothing after
// it, with value.
func Document(body []byte, value func(*Decoder) error) error {
	d := NewDecoder(body)
	if d.Peek() != '{' {
		return ErrSyntax
	}
	if err := value(d); err != nil {
		return err
	}
	return d.End()
}

// StringFields calls fn with each string-valued key of the JSON object
// obj, in order; other values (numbers, nested objects, …) are skipped.
func StringFields(obj []byte, fn func(key, value string)) error {
	return Document(obj, func(d *Decoder) error {
		return d.Object(func(key string) error {
			if d.Peek() != '"' {
				return d.Skip()
			}
			v, err := d.Str()
			if err == nil {
				fn(key, v)
			}
			return err
		})
	})
}

func (d *Decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// Peek returns the next byte that is not white space (0 at the end)
// without consuming it.
func (d *Decoder) Peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *Decoder) literal(lit string) bool {
	d.ws()
	if len(d.b)-d.i >= len(lit) && string(d.b[d.i:d.i+len(lit)]) == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// Null consumes a null and reports whether there was one.
func (d *Decoder) Null() bool { return d.Peek() == 'n' && d.literal("null") }

// Object calls field for each key of an object (none for null); field
// must consume the value.
func (d *Decoder) Object(field func(key string) error) error {
	if d.Null() {
		return nil
	}
	if d.Peek() != '{' {
		return ErrSyntax
	}
	d.i++
	if d.Peek() == '}' {
		d.i++
		return nil
	}
	for {
		key, err := d.Str()
		if err != nil {
			return err
		}
		if d.Peek() != ':' {
			return ErrSyntax
		}
		d.i++
		if err := field(key); err != nil {
			return err
		}
		switch d.Peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return ErrSyntax
		}
	}
}

// Str reads a string ("" for null).
func (d *Decoder) Str() (string, error) {
	if d.Null() {
		return "", nil
	}
	if d.Peek() != '"' {
		return "", ErrSyntax
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
			return "", ErrSyntax
		default:
			d.i++
		}
	}
	return "", ErrSyntax
}

// escapedStr finishes a string that has escapes, from its first byte. A
// lone surrogate becomes U+FFFD, as with encoding/json.
func (d *Decoder) escapedStr(start int) (string, error) {
	out := append([]byte(nil), d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return string(out), nil
		case c < 0x20:
			return "", ErrSyntax
		case c != '\\':
			out = append(out, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.b) {
			return "", ErrSyntax
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
			r, ok := d.escapedRune()
			if !ok {
				return "", ErrSyntax
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", ErrSyntax
		}
	}
	return "", ErrSyntax
}

// escapedRune reads what follows a \u: four hex digits, and the low half
// of a surrogate pair when one follows a high half.
func (d *Decoder) escapedRune() (rune, bool) {
	r, ok := d.hex4()
	switch {
	case !ok:
		return 0, false
	case r >= 0xdc00 && r < 0xe000:
		return utf8.RuneError, true
	case r < 0xd800 || r >= 0xdc00:
		return r, true
	}
	if d.i+1 < len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
		save := d.i
		d.i += 2
		if lo, ok := d.hex4(); ok && lo >= 0xdc00 && lo < 0xe000 {
			return (r-0xd800)<<10 + (lo - 0xdc00) + 0x10000, true
		}
		d.i = save
	}
	return utf8.RuneError, true
}

func (d *Decoder) hex4() (rune, bool) {
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

// Number returns the raw text of a number (its characters, not checked
// against JSON's grammar: Int and Uint parse it).
func (d *Decoder) Number() ([]byte, error) {
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
		return nil, ErrSyntax
	}
	return d.b[start:d.i], nil
}

// Int reads an integer (0 for null).
func (d *Decoder) Int() (int, error) {
	if d.Null() {
		return 0, nil
	}
	num, err := d.Number()
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(num))
	if err != nil {
		return 0, ErrSyntax
	}
	return n, nil
}

// Uint reads an unsigned integer (0 for null).
func (d *Decoder) Uint() (uint64, error) {
	if d.Null() {
		return 0, nil
	}
	num, err := d.Number()
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(string(num), 10, 64)
	if err != nil {
		return 0, ErrSyntax
	}
	return n, nil
}

// Bool reads a boolean (false for null).
func (d *Decoder) Bool() (bool, error) {
	switch {
	case d.literal("true"):
		return true, nil
	case d.literal("false"), d.Null():
		return false, nil
	}
	return false, ErrSyntax
}

// Strings reads an array of strings (nil for null).
func (d *Decoder) Strings() ([]string, error) {
	var out []string
	err := d.array(func() error {
		s, err := d.Str()
		out = append(out, s)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// array calls elem for each element of an array (none for null); elem
// must consume the element.
func (d *Decoder) array(elem func() error) error {
	if d.Null() {
		return nil
	}
	if d.Peek() != '[' {
		return ErrSyntax
	}
	d.i++
	if d.Peek() == ']' {
		d.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch d.Peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return ErrSyntax
		}
	}
}

// Skip consumes any value; objects and arrays nest at most maxDepth deep.
func (d *Decoder) Skip() error {
	switch c := d.Peek(); {
	case c == '{' || c == '[':
		if d.depth++; d.depth > maxDepth {
			return ErrSyntax
		}
		defer func() { d.depth-- }()
		if c == '{' {
			return d.Object(func(string) error { return d.Skip() })
		}
		return d.array(d.Skip)
	case c == '"':
		_, err := d.Str()
		return err
	case c == 't' || c == 'f' || c == 'n':
		if d.literal("true") || d.literal("false") || d.literal("null") {
			return nil
		}
		return ErrSyntax
	default:
		_, err := d.Number()
		return err
	}
}

// End checks that only white space follows the value.
func (d *Decoder) End() error {
	if d.ws(); d.i != len(d.b) {
		return ErrSyntax
	}
	return nil
}
