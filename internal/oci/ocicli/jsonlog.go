package ocicli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// withLogError adds to err, the failure of a runtime call that logged to
// logPath (Create, Restore), the error messages the runtime wrote there,
// unless err already says them: runc's exit status alone names no cause.
func withLogError(err error, logPath string) error {
	if msg := LastLogError(logPath); msg != "" && !strings.Contains(err.Error(), msg) {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// LastLogError returns the error and fatal messages a runtime wrote to its
// JSON log, joined by "; ". It reads each line with stringFields, not
// encoding/json, which the monitor does not link.
func LastLogError(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msgs []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		var level, msg string
		err := stringFields(line, func(key, value string) {
			switch key {
			case "level":
				level = value
			case "msg":
				msg = value
			}
		})
		if err == nil && (level == "error" || level == "fatal") {
			msgs = append(msgs, msg)
		}
	}
	return strings.Join(msgs, "; ")
}

// jsonString is the string value of key in the JSON object data ("" if
// none, or not a string).
func jsonString(data []byte, key string) string {
	var v string
	_ = stringFields(data, func(k, value string) {
		if k == key {
			v = value
		}
	})
	return v
}

var errSyntax = errors.New("invalid JSON")

// stringFields calls fn with each string-valued key of the JSON object
// obj, in order; other values (numbers, nested objects, …) are skipped
// unread. It is what the runtime's JSON (its log lines, `state`) needs,
// not a validator.
func stringFields(obj []byte, fn func(key, value string)) error {
	s := &scanner{b: obj}
	if !s.consume('{') {
		return errSyntax
	}
	if s.consume('}') {
		return s.end()
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if !s.consume(':') {
			return errSyntax
		}
		if s.peek() == '"' {
			v, err := s.str()
			if err != nil {
				return err
			}
			fn(key, v)
		} else if err := s.skip(); err != nil {
			return err
		}
		if s.consume(',') {
			continue
		}
		if s.consume('}') {
			return s.end()
		}
		return errSyntax
	}
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) consume(c byte) bool {
	if s.peek() == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) end() error {
	if s.ws(); s.i != len(s.b) {
		return errSyntax
	}
	return nil
}

// skip passes over a value that is not a string: up to the ',' or '}'
// that ends it, stepping over nested objects, arrays and their strings.
func (s *scanner) skip() error {
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			if _, err := s.str(); err != nil {
				return err
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return nil
			}
			depth--
		case ',':
			if depth == 0 {
				return nil
			}
		}
		s.i++
	}
	return errSyntax
}

// str reads a JSON string.
func (s *scanner) str() (string, error) {
	if !s.consume('"') {
		return "", errSyntax
	}
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return string(s.b[start : s.i-1]), nil
		case c == '\\':
			return s.escapedStr(start)
		case c < 0x20:
			return "", errSyntax
		}
		s.i++
	}
	return "", errSyntax
}

// escapedStr finishes a string with escapes, begun at start.
func (s *scanner) escapedStr(start int) (string, error) {
	out := append([]byte(nil), s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return string(out), nil
		case c < 0x20:
			return "", errSyntax
		case c != '\\':
			out = append(out, c)
			continue
		}
		if s.i >= len(s.b) {
			return "", errSyntax
		}
		e := s.b[s.i]
		s.i++
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
			r, ok := s.hex4()
			if !ok {
				return "", errSyntax
			}
			if 0xD800 <= r && r < 0xDC00 && s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
				save := s.i
				s.i += 2
				if lo, ok := s.hex4(); ok && 0xDC00 <= lo && lo < 0xE000 {
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				} else {
					s.i = save
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", errSyntax
		}
	}
	return "", errSyntax
}

// hex4 reads the four hex digits of a \u escape.
func (s *scanner) hex4() (rune, bool) {
	if s.i+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.i : s.i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	s.i += 4
	return r, true
}
