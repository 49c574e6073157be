package fuseconn

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validSettings is an INIT request of protocol 7.45 with FUSE_HAS_RESEND
// and a reply to it, as a mount saves them.
func validSettings() *Settings {
	le := binary.LittleEndian
	init := make([]byte, inHeaderSize+64)
	le.PutUint32(init[0:], uint32(len(init)))
	le.PutUint32(init[4:], opInit)
	le.PutUint64(init[8:], 2) // unique
	le.PutUint32(init[inHeaderSize:], 7)
	le.PutUint32(init[inHeaderSize+4:], 45)
	le.PutUint32(init[inHeaderSize+16:], hasResend>>32)
	reply := make([]byte, outHeaderSize+64)
	le.PutUint32(reply[0:], uint32(len(reply)))
	le.PutUint64(reply[8:], 2)
	return &Settings{Init: init, Reply: reply}
}

func TestSettingsSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fuse.json")
	s := validSettings()
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Init, s.Init) || !bytes.Equal(got.Reply, s.Reply) {
		t.Fatalf("Load = %+v, want %+v", got, s)
	}
	if !got.CanResend() {
		t.Fatal("CanResend = false for a kernel that sent FUSE_HAS_RESEND")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
}

// A settings file that is not a handshake a server can resume is refused
// with an error that says why; none panics.
func TestLoadRefusesBadSettings(t *testing.T) {
	le := binary.LittleEndian
	edit := func(f func(s *Settings)) string {
		s := validSettings()
		f(s)
		var b bytes.Buffer
		b.WriteString(`{"init":"`)
		b.WriteString(b64(s.Init))
		b.WriteString(`","reply":"`)
		b.WriteString(b64(s.Reply))
		b.WriteString(`"}`)
		return b.String()
	}
	for _, tc := range []struct {
		name, data, want string
	}{
		{"empty", "", "unexpected end of JSON"},
		{"not json", "INIT", "invalid character"},
		{"too large", `{"init":"` + strings.Repeat("A", maxSettingsFile) + `"}`, "larger than"},
		{"no init", `{"reply":"AAAA"}`, "too short"},
		{"short init", edit(func(s *Settings) { s.Init = s.Init[:inHeaderSize] }), "too short"},
		{"init length lies", edit(func(s *Settings) { le.PutUint32(s.Init[0:], 4096) }), "says 4096 bytes"},
		{"not INIT", edit(func(s *Settings) { le.PutUint32(s.Init[4:], 15) }), "opcode 15"},
		{"short reply", edit(func(s *Settings) { s.Reply = s.Reply[:outHeaderSize] }), "reply of 16 bytes"},
		{"reply length lies", edit(func(s *Settings) { le.PutUint32(s.Reply[0:], 1) }), "says 1 bytes"},
		{"error reply", edit(func(s *Settings) { le.PutUint32(s.Reply[4:], uint32(0xffffffea)) }), "is an error"},
		{"other unique", edit(func(s *Settings) { le.PutUint64(s.Reply[8:], 3) }), "another request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fuse.json")
			if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, want an error with %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), path) {
				t.Fatalf("error %q does not name the file", err)
			}
		})
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
