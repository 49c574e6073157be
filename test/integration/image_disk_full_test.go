package integration

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// fillDisk writes path until its filesystem refuses another byte.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, chunk := range []int{1 << 20, 64 << 10, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatalf("fill %s: %v", path, err)
				}
				break
			}
		}
	}
}

// TestImagePullOnAFullDiskLeavesNoIngestFile pulls onto a full disk
// (berthd's root a small tmpfs, filled): the pull fails and leaves
// nothing in the image store, not even the half-written ingest file of
// the first blob it stores (issue 35's soak found one left by every
// such pull, for ever: writeBlob removed its temporary file only when
// the rename failed, not the write), and says ResourceExhausted; with
// space again the pull works.
func TestImagePullOnAFullDiskLeavesNoIngestFile(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	var root string
	t.Cleanup(func() {
		if root != "" {
			_ = unix.Unmount(root, unix.MNT_DETACH)
		}
	})
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		if err := os.MkdirAll(c.Root, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("berth-full-disk", c.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16m,mode=0711"); err != nil {
			t.Fatalf("mount a small root: %v", err)
		}
		root = c.Root
	}})
	scope, before := storeLeakScope(t, d)
	ballast := filepath.Join(d.Root, "ballast")
	fillDisk(t, ballast)

	ref := reg.Ref(testimages.BusyboxRef)
	_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	if err == nil {
		t.Fatal("a pull onto a full disk succeeded")
	}
	t.Logf("pull onto a full disk: %v", err)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("pull onto a full disk: %s, want ResourceExhausted", status.Code(err))
	}
	waitStoreEmpty(t, d)
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	leakcheck.Check(t, before, leakcheck.Take(t, scope))
	pull(t, d, ref, nil)
}
