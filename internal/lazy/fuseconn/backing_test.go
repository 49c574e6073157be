package fuseconn

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

const testConn = "00112233445566778899aabbccddeeff"

// testFiles is a tree's regular files: nodes 3 and 4.
func testFiles() map[uint64]*fs.Inode { return map[uint64]*fs.Inode{3: nil, 4: nil} }

func recordsFile(t *testing.T, conn string, recs ...[]byte) string {
	t.Helper()
	id, err := hex.DecodeString(conn)
	if err != nil {
		t.Fatal(err)
	}
	data := append([]byte(backingMagic), id...)
	for _, r := range recs {
		data = append(data, r...)
	}
	path := filepath.Join(t.TempDir(), "backing")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The records a server finds: its predecessors' backing IDs are used,
// their cached-mode opens are inherited, another connection's records
// are begun again.
func TestBackingRecordsRead(t *testing.T) {
	path := recordsFile(t, testConn, encodeRecord(3, 0), encodeRecord(3, 7), encodeRecord(4, 0))
	b, err := openBacking(path, testConn, testFiles(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	if b.ids[3] != 7 || b.ids[4] != 0 || !b.stayCached[4] || len(b.ids) != 2 {
		t.Fatalf("ids %v, inherited %v", b.ids, b.stayCached)
	}

	// An open of node 3, whatever the tree answered, is passed through
	// to backing ID 7; one of node 4 stays in cached mode.
	out := fuse.OpenOut{OpenFlags: fuse.FOPEN_KEEP_CACHE}
	if err := b.open(3, &out); err != nil || out.BackingID != 7 || out.OpenFlags != fuse.FOPEN_PASSTHROUGH {
		t.Fatalf("open of node 3: %+v, %v", out, err)
	}
	out = fuse.OpenOut{OpenFlags: fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_PASSTHROUGH}
	if err := b.open(4, &out); err != nil || out.BackingID != 0 || out.OpenFlags != fuse.FOPEN_KEEP_CACHE {
		t.Fatalf("open of node 4: %+v, %v", out, err)
	}
	// Not a regular file of the tree: never passed through, not recorded.
	out = fuse.OpenOut{OpenFlags: fuse.FOPEN_PASSTHROUGH}
	if err := b.open(9, &out); err != nil || out.OpenFlags != 0 {
		t.Fatalf("open of node 9: %+v, %v", out, err)
	}
	if st, _ := os.Stat(path); st.Size() != int64(backingHeader+3*backingRecord) {
		t.Fatalf("records grew to %d bytes", st.Size())
	}

	// Another connection's records (the layer was mounted again).
	b2, err := openBacking(path, strings.Repeat("ab", 16), testFiles(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.close()
	if len(b2.ids) != 0 {
		t.Fatalf("another connection's records used: %v", b2.ids)
	}
	// A cached-mode open is recorded before it is answered.
	out = fuse.OpenOut{OpenFlags: fuse.FOPEN_KEEP_CACHE}
	if err := b2.open(4, &out); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != backingHeader+backingRecord || !bytes.Equal(data[backingHeader:], encodeRecord(4, 0)) {
		t.Fatalf("records after a cached open: %x", data)
	}
	// This server's own cached opens do not keep it from passthrough
	// later (the tree asks for it once they are closed): that needs a
	// registration, which b2 cannot make without a server, so only the
	// branch is checked: no inherited mark.
	if b2.stayCached[4] {
		t.Fatal("a server's own cached open taken as a predecessor's")
	}

	// Past MaxBackingFiles, a file not yet passed through opens in cached
	// mode, recorded so.
	b2.held = MaxBackingFiles
	out = fuse.OpenOut{OpenFlags: fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_PASSTHROUGH}
	if err := b2.open(3, &out); err != nil || out.OpenFlags != fuse.FOPEN_KEEP_CACHE || b2.ids[3] != 0 {
		t.Fatalf("open past the bound: %+v, %v, recorded %v", out, err, b2.ids)
	}
}

// Records that this code did not write are refused, bounded: the server
// then does not serve the connection (lazysrv aborts it).
func TestBackingRecordsHostile(t *testing.T) {
	bad := encodeRecord(3, 5)
	bad[0] ^= 1
	for _, tc := range []struct {
		name string
		recs [][]byte
		want string
	}{
		{"checksum", [][]byte{bad}, "checksum"},
		{"unknown node", [][]byte{encodeRecord(9, 5)}, "not a regular file"},
		{"two IDs", [][]byte{encodeRecord(3, 5), encodeRecord(3, 6)}, "backing IDs 5 and 6"},
		{"negative ID", [][]byte{encodeRecord(3, -1)}, "backing ID -1"},
		{"torn", [][]byte{encodeRecord(3, 5)[:10]}, "bytes of records"},
		{"too many", [][]byte{encodeRecord(3, 0), encodeRecord(3, 5), encodeRecord(4, 0), encodeRecord(4, 6), encodeRecord(4, 6)}, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := recordsFile(t, testConn, tc.recs...)
			b, err := openBacking(path, testConn, testFiles(), nil, nil)
			if err == nil {
				b.close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q", err, tc.want)
			}
		})
	}
	for _, conn := range []string{"xyz", "0011", strings.Repeat("0", 34)} {
		if _, err := openBacking(filepath.Join(t.TempDir(), "backing"), conn, testFiles(), nil, nil); err == nil {
			t.Errorf("connection ID %q accepted", conn)
		}
	}
	// Settings from before connection IDs: no records, no passthrough.
	b, err := openBacking(filepath.Join(t.TempDir(), "backing"), "", testFiles(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := fuse.OpenOut{OpenFlags: fuse.FOPEN_PASSTHROUGH}
	if err := b.open(3, &out); err != nil || out.OpenFlags != 0 {
		t.Fatalf("open without a connection ID: %+v, %v", out, err)
	}
}
