package jsonlite

import (
	"strings"
	"testing"
)

// Moved from ocicli (and before that shim/proto) with the scanner.
func TestStringFields(t *testing.T) {
	got := map[string]string{}
	err := StringFields([]byte(`{"level":"error","n":1,"msg":"exec: \"nope\"","x":{"msg":"inner"}}`), func(k, v string) { got[k] = v })
	if err != nil || len(got) != 2 || got["level"] != "error" || got["msg"] != `exec: "nope"` {
		t.Fatalf("%v, %v", got, err)
	}
	if StringFields([]byte(`not json`), func(string, string) {}) == nil {
		t.Fatal("no error for garbage")
	}
}

func TestStringFieldsEscapes(t *testing.T) {
	got := map[string]string{}
	err := StringFields([]byte(`{"a":"\u00e9\ud83d\ude00\/\t","b":[1,{"c":"}"}],"d":null,"e":"x","f":"\ud800x\udc00"}`), func(k, v string) { got[k] = v })
	if err != nil || got["a"] != "\u00e9\U0001F600/\t" || got["e"] != "x" || got["f"] != "\ufffdx\ufffd" || len(got) != 3 {
		t.Fatalf("%q, %v", got, err)
	}
	for _, bad := range []string{`{"a":"open`, `{"a" "b"}`, `{"a":"b"} x`, `{"a":"\q"}`, `{"a":1`, `{"a":[1,}`, `{"a":tru}`, `{"a":"\u12"}`, `{"a":"x` + "\x01" + `"}`, `null`, `[]`} {
		if StringFields([]byte(bad), func(string, string) {}) == nil {
			t.Errorf("no error for %s", bad)
		}
	}
}

// A hostile nesting depth is refused, not followed down the stack.
func TestSkipBoundsNesting(t *testing.T) {
	for _, tc := range []struct {
		depth int
		ok    bool
	}{{1, true}, {maxDepth, true}, {maxDepth + 1, false}, {1 << 20, false}} {
		doc := `{"a":` + strings.Repeat("[", tc.depth) + strings.Repeat("]", tc.depth) + `,"b":"x"}`
		b := ""
		err := StringFields([]byte(doc), func(k, v string) { b = v })
		if (err == nil) != tc.ok || (tc.ok && b != "x") {
			t.Errorf("depth %d: %v, b=%q", tc.depth, err, b)
		}
	}
}

func TestDecoderShapes(t *testing.T) {
	d := NewDecoder([]byte(` {"s":"x","i":-3,"u":18446744073709551615,"t":true,"f":false,"n":null,"l":["a",null,"b"],"o":{"k":"v"}} `))
	var (
		s, k    string
		i       int
		u       uint64
		tr, f   bool
		l       []string
		nullStr string
	)
	err := d.Object(func(key string) (err error) {
		switch key {
		case "s":
			s, err = d.Str()
		case "i":
			i, err = d.Int()
		case "u":
			u, err = d.Uint()
		case "t":
			tr, err = d.Bool()
		case "f":
			f, err = d.Bool()
		case "n":
			nullStr, err = d.Str()
		case "l":
			l, err = d.Strings()
		case "o":
			err = d.Object(func(string) (err error) { k, err = d.Str(); return err })
		}
		return err
	})
	if err == nil {
		err = d.End()
	}
	if err != nil || s != "x" || i != -3 || u != 1<<64-1 || !tr || f || nullStr != "" || strings.Join(l, ",") != "a,,b" || k != "v" {
		t.Fatalf("%v: %q %d %d %v %v %q %q %q", err, s, i, u, tr, f, nullStr, l, k)
	}
	for _, bad := range []func(*Decoder) error{
		func(d *Decoder) error { _, err := d.Int(); return err },
		func(d *Decoder) error { _, err := d.Uint(); return err },
		func(d *Decoder) error { _, err := d.Bool(); return err },
		func(d *Decoder) error { _, err := d.Strings(); return err },
	} {
		if bad(NewDecoder([]byte(`"1"`))) == nil {
			t.Error("a string read as another shape")
		}
	}
}

func TestObjectWriter(t *testing.T) {
	o := BeginObject([]byte("x"))
	o.Str("s", "a\"\\\n\r\t\x01<&> é \xff")
	o.StrOmit("empty", "")
	o.IntOmit("zero", 0)
	o.Int("i", -1)
	o.BoolOmit("no", false)
	o.BoolOmit("yes", true)
	o.Key("l")
	o.B = AppendStrings(o.B, []string{"a", ""})
	got := string(o.End())
	want := `x{"s":"a\"\\\n\r\t\u0001<&> é ` + "\ufffd" + `","i":-1,"yes":true,"l":["a",""]}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
