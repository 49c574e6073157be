package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBigImageCache generates the big image's cache ahead of a bench run
// (BENCH_BIG_GENERATE=1); the benchmark does it itself otherwise.
func TestBigImageCache(t *testing.T) {
	if os.Getenv("BENCH_BIG_GENERATE") == "" {
		t.Skip("BENCH_BIG_GENERATE unset")
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	gz, zst, err := BuildBigImages(BigImageCacheDir(), strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	for _, bi := range []*BigImage{gz, zst} {
		t.Logf("%s: %d MB blobs, %d MB unpacked", bi.Compression, bi.Compressed()>>20, bi.Unpacked()>>20)
		for _, l := range bi.Layers {
			t.Logf("  %s %d MB (%d MB unpacked)", l.Digest, l.Size>>20, l.Unpacked>>20)
		}
	}
}
