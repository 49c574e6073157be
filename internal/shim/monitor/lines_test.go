package monitor

import (
	"bytes"
	"strings"
	"testing"
)

type record struct {
	tag string
	msg string
}

func split(t testing.TB, chunks ...[]byte) []record {
	t.Helper()
	var out []record
	l := newLineSplitter(func(tag string, msg []byte) { out = append(out, record{tag, string(msg)}) })
	for _, c := range chunks {
		l.Write(c)
	}
	l.Flush()
	return out
}

// joinRecords rebuilds the stream from records: P continues a line, F ends it.
func joinRecords(rs []record) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(r.msg)
		if r.tag == "F" {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func TestLineSplitterRecords(t *testing.T) {
	long := strings.Repeat("x", maxLogLine+10)
	for name, tc := range map[string]struct {
		chunks []string
		want   []record
	}{
		"lines":          {[]string{"a\nb\n"}, []record{{"F", "a"}, {"F", "b"}}},
		"split chunks":   {[]string{"he", "llo\nwor", "ld\n"}, []record{{"F", "hello"}, {"F", "world"}}},
		"no final eol":   {[]string{"tail"}, []record{{"P", "tail"}}},
		"lines, no eol":  {[]string{"a\nDONE"}, []record{{"F", "a"}, {"P", "DONE"}}},
		"long line, eof": {[]string{long}, []record{{"P", long[:maxLogLine]}, {"P", long[maxLogLine:]}}},
		"exactly full":   {[]string{long[:maxLogLine]}, []record{{"P", long[:maxLogLine]}}},
		"empty line":     {[]string{"\n"}, []record{{"F", ""}}},
		"long line P, F": {[]string{long + "\n"}, []record{{"P", long[:maxLogLine]}, {"F", long[maxLogLine:]}}},
	} {
		t.Run(name, func(t *testing.T) {
			var chunks [][]byte
			for _, c := range tc.chunks {
				chunks = append(chunks, []byte(c))
			}
			got := split(t, chunks...)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d records %v, want %v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("record %d: got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// FuzzLineSplitter checks that records always rebuild the stream exactly,
// never exceed maxLogLine and never contain a newline, however the input
// is chunked.
func FuzzLineSplitter(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), uint16(3))
	f.Add(bytes.Repeat([]byte("y"), maxLogLine*2+5), uint16(4096))
	f.Add([]byte("\n\n\npartial"), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint16) {
		size := int(chunk)%(maxLogLine+100) + 1
		var chunks [][]byte
		for i := 0; i < len(data); i += size {
			end := min(i+size, len(data))
			chunks = append(chunks, data[i:end])
		}
		rs := split(t, chunks...)
		// The unterminated tail is flushed as P: the records rebuild
		// the stream byte for byte, as the kubelet reads them.
		want := string(data)
		if got := joinRecords(rs); got != want {
			t.Fatalf("records do not rebuild the stream: %d bytes from %d records, want %d bytes", len(got), len(rs), len(want))
		}
		for _, r := range rs {
			if len(r.msg) > maxLogLine || strings.Contains(r.msg, "\n") {
				t.Fatalf("bad record %q (len %d)", r.tag, len(r.msg))
			}
		}
	})
}
