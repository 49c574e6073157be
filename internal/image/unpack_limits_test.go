package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

func TestUnpackLimits(t *testing.T) {
	requireRoot(t)
	var manyDirs, nested, manyEntries []entry
	for i := 0; i < 50; i++ {
		manyDirs = append(manyDirs, entry{name: fmt.Sprintf("d%d/", i), typ: tar.TypeDir, mode: 0o755})
		manyEntries = append(manyEntries, entry{name: fmt.Sprintf("f%d", i), typ: tar.TypeReg})
	}
	nested = []entry{{name: strings.Repeat("a/", 40) + "file", typ: tar.TypeReg, data: "x"}}
	limits := UnpackOptions{MaxLayerSize: 1 << 20, MaxEntries: 40, MaxDirs: 20}
	for _, tc := range []struct {
		name  string
		layer []byte
		want  string
	}{
		{"sparse 1 TiB", testimages.SparseTar("big", 1<<40), "image_limits.max_layer_size"},
		{"dense over the layer size", tarOf(t, entry{name: "big", typ: tar.TypeReg, sparse: true, size: 2 << 20, data: "x"}), "image_limits.max_layer_size"},
		{"files add up over the layer size", tarOf(t,
			entry{name: "a", typ: tar.TypeReg, sparse: true, size: 600 << 10, data: "x"},
			entry{name: "b", typ: tar.TypeReg, sparse: true, size: 600 << 10, data: "x"}), "image_limits.max_layer_size"},
		{"many directories", tarOf(t, manyDirs...), "image_limits.max_layer_dirs"},
		{"implicit parents count as directories", tarOf(t, nested...), "image_limits.max_layer_dirs"},
		{"many entries", tarOf(t, manyEntries...), "image_limits.max_layer_entries"},
		// Headers only: no file data, but a stream past the layer size.
		{"stream of headers over the layer size", func() []byte {
			var es []entry
			for i := 0; i < 1100; i++ {
				es = append(es, entry{name: "same", typ: tar.TypeReg, xattrs: map[string]string{"user.pad": strings.Repeat("p", 600)}})
			}
			return tarOf(t, es...)
		}(), "image_limits.max_layer_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := limits
			if strings.Contains(tc.name, "stream") {
				opts.MaxEntries = 0
			}
			start := time.Now()
			_, err := Unpack(context.Background(), bytes.NewReader(tc.layer), t.TempDir(), "sha256:limits", opts)
			if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v: want ResourceExhausted naming %s", err, tc.want)
			}
			t.Logf("refused in %v: %v", time.Since(start), err)
		})
	}
}

func TestUnpackImageBudgetIsShared(t *testing.T) {
	requireRoot(t)
	budget := NewSizeBudget(1 << 20)
	layer := tarOf(t, entry{name: "f", typ: tar.TypeReg, sparse: true, size: 600 << 10, data: "x"})
	if _, err := Unpack(context.Background(), bytes.NewReader(layer), t.TempDir(), "sha256:one", UnpackOptions{Image: budget}); err != nil {
		t.Fatal(err)
	}
	_, err := Unpack(context.Background(), bytes.NewReader(layer), t.TempDir(), "sha256:two", UnpackOptions{Image: budget})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "image_limits.max_image_size") {
		t.Fatalf("second layer: %v, want ResourceExhausted naming max_image_size", err)
	}
}

// TestUnpackStopsWhenCancelled: with no size limit, a sparse 1 TiB entry
// is written (as holes) until the context is cancelled, then the unpack
// returns at once.
func TestUnpackStopsWhenCancelled(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Unpack(ctx, bytes.NewReader(testimages.SparseTar("big", 1<<40)), t.TempDir(), "sha256:cancel", UnpackOptions{})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("unpack after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("unpack still running a minute after its context was cancelled")
	}
}

func TestUnpackDropsPrivilegedXattrs(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	layer := tarOf(t,
		entry{name: "lower/", typ: tar.TypeDir, mode: 0o755, xattrs: map[string]string{
			"trusted.overlay.opaque": "y", "trusted.overlay.redirect": "/etc", "security.selinux": "system_u:object_r:shadow_t:s0",
			"user.keep": "dir"}},
		entry{name: "lower/file", typ: tar.TypeReg, data: "x", xattrs: map[string]string{
			"trusted.overlay.metacopy": "", "trusted.evil": "1", "user.keep": "file"}},
		entry{name: "lower/big", typ: tar.TypeReg, sparse: true, size: 300 << 10, data: "x", xattrs: map[string]string{
			"trusted.overlay.metacopy": "", "user.keep": "big"}},
	)
	if _, err := Unpack(context.Background(), bytes.NewReader(layer), root, "sha256:xattr", UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	for _, p := range []string{"lower", "lower/file", "lower/big"} {
		for _, x := range []string{"trusted.overlay.opaque", "trusted.overlay.redirect", "trusted.overlay.metacopy", "trusted.evil", "security.selinux"} {
			if n, err := unix.Lgetxattr(filepath.Join(root, p), x, buf); err == nil {
				t.Errorf("%s has %s=%q", p, x, buf[:n])
			}
		}
		if _, err := unix.Lgetxattr(filepath.Join(root, p), "user.keep", buf); err != nil && !errors.Is(err, unix.ENOTSUP) {
			t.Errorf("%s lost user.keep: %v", p, err)
		}
	}
	for _, x := range []string{"user.a", "security.capability", "system.posix_acl_access", "system.posix_acl_default"} {
		if !allowedXattr(x) {
			t.Errorf("%s refused", x)
		}
	}
	for _, x := range []string{"trusted.overlay.opaque", "trusted.x", "security.selinux", "security.ima", "system.nfs4_acl", "overlay.opaque", ""} {
		if allowedXattr(x) {
			t.Errorf("%s allowed", x)
		}
	}
}

// TestUnpackCreatesDeviceNodes: what `docker import` of a debootstrap
// rootfs gives (decision 3420).
func TestUnpackCreatesDeviceNodes(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "dev/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "dev/console", Typeflag: tar.TypeChar, Mode: 0o600, Devmajor: 5, Devminor: 1, Uid: 0, Gid: 5},
		{Name: "dev/loop0", Typeflag: tar.TypeBlock, Mode: 0o660, Devmajor: 7, Devminor: 0, Gid: 6},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	if _, err := Unpack(context.Background(), &buf, root, "sha256:dev", UnpackOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name         string
		typ          uint32
		major, minor uint32
		mode         uint32
		gid          uint32
	}{
		{"dev/null", unix.S_IFCHR, 1, 3, 0o666, 0},
		{"dev/console", unix.S_IFCHR, 5, 1, 0o600, 5},
		{"dev/loop0", unix.S_IFBLK, 7, 0, 0o660, 6},
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, c.name), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != c.typ || unix.Major(st.Rdev) != c.major || unix.Minor(st.Rdev) != c.minor || st.Mode&0o7777 != c.mode || st.Gid != c.gid {
			t.Errorf("%s: mode %o rdev %d:%d gid %d", c.name, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Gid)
		}
	}
}

// FuzzUnpack feeds arbitrary tar streams to the unpacker. Invariants:
// nothing is written outside the target dir, no panic, the apparent size
// of what it made stays within the layer limit, and every refusal is
// InvalidArgument or ResourceExhausted (or the tar's own format error).
func FuzzUnpack(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("unpack needs root (chown, mknod, trusted xattrs)")
	}
	seed := func(entries ...entry) []byte {
		t := &testing.T{}
		return tarOf(t, entries...)
	}
	f.Add(testimages.SparseTar("big", 1<<40))
	f.Add(seed(entry{name: "dir/", typ: tar.TypeDir}, entry{name: "dir/f", typ: tar.TypeReg, data: "hello"},
		entry{name: "dir/.wh.x", typ: tar.TypeReg}, entry{name: "dir/l", typ: tar.TypeLink, link: "dir/f"}))
	f.Add(seed(entry{name: "evil", typ: tar.TypeSymlink, link: "/"}, entry{name: "evil/x", typ: tar.TypeReg, data: "x"}))
	f.Add(seed(entry{name: "../x", typ: tar.TypeReg, data: "x"}))
	f.Add(seed(entry{name: "d/", typ: tar.TypeDir, xattrs: map[string]string{"trusted.overlay.opaque": "y"}}, entry{name: "d/.wh..wh..opq", typ: tar.TypeReg}))
	f.Add(seed(entry{name: "dev/null", typ: tar.TypeChar}, entry{name: "fifo", typ: tar.TypeFifo}))
	f.Add(seed(entry{name: "a/b/c/d/e", typ: tar.TypeReg, data: "deep"}, entry{name: "a/b", typ: tar.TypeSymlink, link: "../.."}, entry{name: "a/b/x", typ: tar.TypeReg}))
	const maxLayer = 4 << 20
	f.Fuzz(func(t *testing.T, layer []byte) {
		outer := t.TempDir()
		sentinel := filepath.Join(outer, "outside")
		if err := os.WriteFile(sentinel, []byte("host"), 0o644); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(outer, "layer")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := Unpack(ctx, bytes.NewReader(layer), root, "sha256:fuzz", UnpackOptions{MaxLayerSize: maxLayer, MaxEntries: 1000, MaxDirs: 200})
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrResourceExhausted) &&
			!strings.Contains(err.Error(), "read tar") && !strings.Contains(err.Error(), "read file data") &&
			!errors.Is(err, context.DeadlineExceeded) {
			// Other errors are the file system's (a name too long, a
			// directory not empty): fine as long as nothing escaped.
			t.Logf("unpack: %v", err)
		}
		es, _ := os.ReadDir(outer)
		if len(es) != 2 {
			t.Fatalf("the target's parent holds %d entries, want 2", len(es))
		}
		if data, _ := os.ReadFile(sentinel); string(data) != "host" {
			t.Fatalf("a file outside the target changed: %q", data)
		}
		var apparent int64
		inodes := map[uint64]bool{}
		_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return nil
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().IsRegular() && ok && !inodes[st.Ino] {
				inodes[st.Ino] = true // hard links: once
				apparent += fi.Size()
			}
			return nil
		})
		if apparent > maxLayer {
			t.Fatalf("unpacked %d bytes, over the %d limit", apparent, maxLayer)
		}
	})
}
