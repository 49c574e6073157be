package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
)

type entry struct {
	name     string
	typ      byte
	data     string
	link     string
	size     int64 // for sparse: logical size
	mode     int64
	uid, gid int
	xattrs   map[string]string
	sparse   bool
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: time.Unix(1600000000, 0), Format: tar.FormatPAX}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.data))
			if e.sparse {
				h.Size = e.size
			}
		}
		if e.typ == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if len(e.xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range e.xattrs {
				h.PAXRecords[paxXattrPrefix+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if e.sparse {
				// A big file of zeros with data at the end.
				if _, err := io.CopyN(tw, zeroReader{}, e.size-int64(len(e.data))); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpack tests need root (chown, mknod, trusted xattrs)")
	}
}

// snapshot records every path below dir with its size and mode, so a test
// can prove nothing outside the layer root changed.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out[p] = fi.Mode().String() + "/" + fi.ModTime().String()
		}
		return nil
	})
	return out
}

func TestUnpackRefusesMaliciousLayers(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name    string
		entries []entry
		want    string
	}{
		{"dotdot", []entry{{name: "../x", typ: tar.TypeReg, data: "evil"}}, `"../x"`},
		{"dotdot inside", []entry{{name: "a/../../x", typ: tar.TypeReg, data: "evil"}}, `".."`},
		{"absolute", []entry{{name: "/etc/x", typ: tar.TypeReg, data: "evil"}}, "absolute"},
		{"write through symlink to /", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: "/"},
			{name: "evil/HOSTFILE", typ: tar.TypeReg, data: "evil"},
		}, "symlink"},
		{"write through relative symlink escape", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: "../../../.."},
			{name: "evil/HOSTFILE", typ: tar.TypeReg, data: "evil"},
		}, "symlink"},
		{"hardlink to host file", []entry{{name: "passwd", typ: tar.TypeLink, link: "/HOSTFILE"}}, "absolute"},
		{"hardlink dotdot", []entry{{name: "passwd", typ: tar.TypeLink, link: "../HOSTFILE"}}, `".."`},
		{"hardlink through symlink", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: "/"},
			{name: "passwd", typ: tar.TypeLink, link: "evil/HOSTFILE"},
		}, "symlink"},
		{"device node through symlink", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: "/"},
			{name: "evil/HOSTFILE", typ: tar.TypeChar},
		}, "symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outer := t.TempDir()
			host := filepath.Join(outer, "HOSTFILE")
			if err := os.WriteFile(host, []byte("host\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(outer, "a", "b", "layer")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			// Absolute names and symlinks to "/" would hit the real host's
			// root: make the host file name unique to this test's dir.
			for i := range tc.entries {
				tc.entries[i].name = strings.ReplaceAll(tc.entries[i].name, "HOSTFILE", strings.TrimPrefix(host, "/"))
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "/HOSTFILE", host)
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "HOSTFILE", strings.TrimPrefix(host, "/"))
			}
			before := snapshot(t, outer)
			_, err := Unpack(context.Background(), bytes.NewReader(tarOf(t, tc.entries...)), root, "sha256:test", UnpackOptions{MaxLayerSize: 32 << 20})
			if err == nil {
				t.Fatal("malicious layer was accepted")
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "sha256:test") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q: want InvalidArgument naming the layer and %q", err, tc.want)
			}
			if data, _ := os.ReadFile(host); string(data) != "host\n" {
				t.Fatalf("host file changed: %q", data)
			}
			after := snapshot(t, outer)
			for p, v := range after {
				if strings.HasPrefix(p, root+"/") {
					continue
				}
				if before[p] != v && p != root {
					t.Fatalf("%s outside the layer root changed or appeared", p)
				}
			}
			if _, err := os.Stat("/etc/x"); err == nil {
				t.Fatal("/etc/x exists")
			}
		})
	}
}

// TestUnpackSameNameChmodStaysInTheLayer is containerd's CVE-2021-32760:
// a symlink entry to a host file, then an entry of the same name with
// another mode; a chmod (or chown) that followed the link changed the
// host file. berth replaces what the earlier entry made, so the mode and
// owner land on the layer's own entry and the host file is untouched.
func TestUnpackSameNameChmodStaysInTheLayer(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		then entry
	}{
		{"file setuid", entry{name: "x", typ: tar.TypeReg, data: "layer", mode: 0o4755, uid: 1234, gid: 1234}},
		{"dir world-writable", entry{name: "x", typ: tar.TypeDir, mode: 0o777, uid: 1234, gid: 1234}},
		{"symlink again", entry{name: "x", typ: tar.TypeSymlink, link: "elsewhere", mode: 0o777}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outer := t.TempDir()
			host := filepath.Join(outer, "HOSTFILE")
			if err := os.WriteFile(host, []byte("host\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(outer, "layer")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, outer)
			layer := tarOf(t, entry{name: "x", typ: tar.TypeSymlink, link: host}, tc.then)
			if _, err := Unpack(context.Background(), bytes.NewReader(layer), root, "sha256:chmod", UnpackOptions{MaxLayerSize: 32 << 20}); err != nil {
				t.Fatalf("unpack: %v", err)
			}
			fi, err := os.Stat(host)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSetuid != 0 || st.Uid != 0 || st.Gid != 0 {
				t.Fatalf("host file is now %v uid %d gid %d, want -rw------- 0 0", fi.Mode(), st.Uid, st.Gid)
			}
			if data, _ := os.ReadFile(host); string(data) != "host\n" {
				t.Fatalf("host file content changed: %q", data)
			}
			after := snapshot(t, outer)
			for p, v := range after {
				if strings.HasPrefix(p, root+"/") || p == root {
					continue
				}
				if before[p] != v {
					t.Fatalf("%s outside the layer root changed or appeared", p)
				}
			}
			got, err := os.Lstat(filepath.Join(root, "x"))
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.then.typ == tar.TypeSymlink; (got.Mode()&os.ModeSymlink != 0) != want {
				t.Fatalf("layer's x is %v, want the second entry's type", got.Mode())
			}
		})
	}
}

func TestUnpackHugeSparseFileWithinLimitStaysSparse(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	const size = 256 << 20
	layer := tarOf(t, entry{name: "sparse", typ: tar.TypeReg, sparse: true, size: size, data: "tail"})
	if _, err := Unpack(context.Background(), bytes.NewReader(layer), root, "sha256:sparse", UnpackOptions{MaxLayerSize: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "sparse"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size {
		t.Fatalf("size %d, want %d", st.Size, size)
	}
	if st.Blocks*512 > 1<<20 {
		t.Fatalf("sparse file allocates %d bytes", st.Blocks*512)
	}
	f, _ := os.Open(filepath.Join(root, "sparse"))
	defer f.Close()
	tail := make([]byte, 4)
	if _, err := f.ReadAt(tail, size-4); err != nil || string(tail) != "tail" {
		t.Fatalf("tail %q %v", tail, err)
	}
}

func TestUnpackConvertsWhiteoutsAndKeepsMetadata(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	layer := tarOf(t,
		entry{name: "dir/", typ: tar.TypeDir, mode: 0o750, uid: 12, gid: 34},
		entry{name: "dir/.wh.deleted", typ: tar.TypeReg},
		entry{name: "opq/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "opq/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "opq/new", typ: tar.TypeReg, data: "new"},
		entry{name: "dir/suid", typ: tar.TypeReg, data: "x", mode: 0o4755, uid: 1000, gid: 1000, xattrs: map[string]string{"user.berth": "yes"}},
		entry{name: "dir/hard", typ: tar.TypeLink, link: "dir/suid"},
		entry{name: "dir/sym", typ: tar.TypeSymlink, link: "/etc/passwd"},
		entry{name: "implicit/parent/file", typ: tar.TypeReg, data: "p"},
		entry{name: "fifo", typ: tar.TypeFifo},
	)
	if _, err := Unpack(context.Background(), bytes.NewReader(layer), root, "sha256:ok", UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "dir", "deleted"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("whiteout: %+v %v", st, err)
	}
	buf := make([]byte, 4)
	if n, err := unix.Lgetxattr(filepath.Join(root, "opq"), opaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque xattr: %q %v", buf[:n], err)
	}
	if err := unix.Lstat(filepath.Join(root, "dir"), &st); err != nil || st.Mode&0o7777 != 0o750 || st.Uid != 12 || st.Gid != 34 {
		t.Fatalf("dir metadata: mode %o uid %d gid %d", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if st.Mtim.Sec != 1600000000 {
		t.Fatalf("dir mtime %d, want 1600000000", st.Mtim.Sec)
	}
	if err := unix.Lstat(filepath.Join(root, "dir", "suid"), &st); err != nil || st.Mode&0o7777 != 0o4755 || st.Uid != 1000 || st.Nlink != 2 {
		t.Fatalf("suid file: mode %o uid %d nlink %d", st.Mode&0o7777, st.Uid, st.Nlink)
	}
	if n, err := unix.Lgetxattr(filepath.Join(root, "dir", "suid"), "user.berth", buf); err != nil && !errors.Is(err, unix.ENOTSUP) {
		t.Fatalf("xattr: %v", err)
	} else if err == nil && string(buf[:n]) != "yes" {
		t.Fatalf("xattr value %q", buf[:n])
	}
	if l, err := os.Readlink(filepath.Join(root, "dir", "sym")); err != nil || l != "/etc/passwd" {
		t.Fatalf("symlink %q %v", l, err)
	}
	if err := unix.Lstat(filepath.Join(root, "fifo"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Fatalf("fifo: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(root, "implicit", "parent", "file")); err != nil || string(data) != "p" {
		t.Fatalf("implicit parent: %q %v", data, err)
	}
}

// TestUnpackParallelWritesKeepEntryOrder: small files are written by
// several writers at once, yet every later entry still sees the earlier
// ones complete, exactly as a one-by-one unpack would.
func TestUnpackParallelWritesKeepEntryOrder(t *testing.T) {
	requireRoot(t)
	var entries []entry
	for i := 0; i < 300; i++ {
		entries = append(entries, entry{name: "many/f" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "-" + strings.Repeat("0", i/26), typ: tar.TypeReg, data: strings.Repeat("d", i)})
	}
	entries = append(entries,
		entry{name: "dup", typ: tar.TypeReg, data: "first"},
		entry{name: "dup", typ: tar.TypeReg, data: "second"},
		entry{name: "linked", typ: tar.TypeReg, data: "complete", mode: 0o640, uid: 7},
		entry{name: "hard", typ: tar.TypeLink, link: "linked"},
		entry{name: "becomes-dir", typ: tar.TypeReg, data: "f"},
		entry{name: "becomes-dir/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "becomes-dir/in", typ: tar.TypeReg, data: "in"},
		entry{name: "becomes-link", typ: tar.TypeReg, data: "f"},
		entry{name: "becomes-link", typ: tar.TypeSymlink, link: "dup"},
		entry{name: "gone", typ: tar.TypeReg, data: "g"},
		entry{name: ".wh.gone", typ: tar.TypeReg},
		// Names made without an entry of their own, then replaced:
		// an implicit parent directory, a whiteout, a hard link.
		entry{name: "implicit/x", typ: tar.TypeReg, data: "x"},
		entry{name: "implicit", typ: tar.TypeReg, data: "now a file"},
		entry{name: ".wh.wo", typ: tar.TypeReg},
		entry{name: "wo", typ: tar.TypeReg, data: "over a whiteout"},
		entry{name: "hard2", typ: tar.TypeLink, link: "linked"},
		entry{name: "hard2", typ: tar.TypeReg, data: "not through the link"},
		// Removed, then made again.
		entry{name: "again/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "again/f", typ: tar.TypeReg, data: "old"},
		entry{name: ".wh.again", typ: tar.TypeReg},
		entry{name: "again/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "again/f", typ: tar.TypeReg, data: "new"},
	)
	// With every name tracked, and with tracking dropped early (a
	// layer of more names than maxTrackedNames): the same result.
	for _, maxNames := range []int{maxTrackedNames, 5} {
		unpackInOrder(t, entries, maxNames)
	}

	// A file where a later entry needs a directory is refused, as it
	// would be one entry at a time.
	bad := tarOf(t, entry{name: "f", typ: tar.TypeReg, data: "x"}, entry{name: "f/g", typ: tar.TypeReg, data: "y"})
	if _, err := Unpack(context.Background(), bytes.NewReader(bad), t.TempDir(), "sha256:bad", UnpackOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("file under a file: %v", err)
	}
}

func unpackInOrder(t *testing.T, entries []entry, maxNames int) {
	t.Helper()
	root := t.TempDir()
	if _, err := unpack(context.Background(), bytes.NewReader(tarOf(t, entries...)), root, "sha256:order", UnpackOptions{}, maxNames); err != nil {
		t.Fatalf("tracking %d names: %v", maxNames, err)
	}
	for _, e := range entries[:300] {
		if data, err := os.ReadFile(filepath.Join(root, e.name)); err != nil || string(data) != e.data {
			t.Fatalf("%s: %q %v", e.name, data, err)
		}
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if got := read("dup"); got != "second" {
		t.Fatalf("duplicate entry: %q, want the later one", got)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(root, "hard"), &st); err != nil || st.Nlink != 2 || st.Mode&0o7777 != 0o640 || st.Uid != 7 || read("hard") != "complete" {
		t.Fatalf("hard link to a just-written file: nlink %d mode %o uid %d err %v", st.Nlink, st.Mode&0o7777, st.Uid, err)
	}
	if got := read("becomes-dir/in"); got != "in" {
		t.Fatalf("file replaced by a directory: %q", got)
	}
	if l, err := os.Readlink(filepath.Join(root, "becomes-link")); err != nil || l != "dup" {
		t.Fatalf("file replaced by a symlink: %q %v", l, err)
	}
	if err := unix.Lstat(filepath.Join(root, "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatalf("whiteout over a just-written file: %v", err)
	}
	for name, want := range map[string]string{"implicit": "now a file", "wo": "over a whiteout",
		"hard2": "not through the link", "linked": "complete", "again/f": "new"} {
		if got := read(name); got != want {
			t.Fatalf("%s: %q, want %q", name, got, want)
		}
	}
}

func TestBufPoolReusesBySizeClass(t *testing.T) {
	var p bufPool
	for _, n := range []int{0, 1, 4096, 4097, 100 << 10, maxParallelFile} {
		b := p.get(n)
		if len(b) != n || cap(b) < n || cap(b) > max(2*n, 4096) {
			t.Fatalf("get(%d): len %d cap %d", n, len(b), cap(b))
		}
		p.put(b)
		if again := p.get(n); &again[:1][0] != &b[:1][0] {
			t.Fatalf("get(%d) after put: a new buffer", n)
		}
	}
	p.put(make([]byte, 5000)) // not a class size: dropped
	if b := p.get(5000); cap(b) != 8192 {
		t.Fatalf("get(5000): cap %d", cap(b))
	}
}
