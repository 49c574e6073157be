package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchLayer is an uncompressed layer of dirs directories, each holding
// files files of size bytes, plus one 32 MiB file: the many-small-files
// and the large-file paths of the unpacker in one stream.
func benchLayer(b *testing.B, dirs, files, size int) []byte {
	b.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Unix(1600000000, 0)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i/251)
	}
	for d := 0; d < dirs; d++ {
		dir := fmt.Sprintf("d%03d", d)
		if err := tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mt}); err != nil {
			b.Fatal(err)
		}
		for f := 0; f < files; f++ {
			h := &tar.Header{Name: fmt.Sprintf("%s/f%04d", dir, f), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(size), ModTime: mt}
			if err := tw.WriteHeader(h); err != nil {
				b.Fatal(err)
			}
			if _, err := tw.Write(data); err != nil {
				b.Fatal(err)
			}
		}
	}
	big := bytes.Repeat(data, (32<<20)/size)
	if err := tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(big)), ModTime: mt}); err != nil {
		b.Fatal(err)
	}
	if _, err := tw.Write(big); err != nil {
		b.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkUnpack unpacks a layer of 4000 files of 4 KiB in 40 dirs and
// one 32 MiB file (about 48 MiB of tar) into a fresh dir per iteration.
func BenchmarkUnpack(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("unpack needs root (chown, mknod, trusted xattrs)")
	}
	layer := benchLayer(b, 40, 100, 4<<10)
	work := b.TempDir()
	b.SetBytes(int64(len(layer)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(work, fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		opts := UnpackOptions{MaxLayerSize: 32 << 30, MaxEntries: 1 << 22, MaxDirs: 1 << 20}
		if _, err := Unpack(context.Background(), bytes.NewReader(layer), dir, "bench", opts); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.RemoveAll(dir)
		b.StartTimer()
	}
}
