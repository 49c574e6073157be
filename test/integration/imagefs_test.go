package integration

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// mountTmpfs mounts a tmpfs of its own at dir (berthdtest's cleanup
// unmounts everything below the daemon's dir).
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=256m,mode=0711"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

func devOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

// TestSplitContainerFilesystem runs a berthd whose containers directory
// (writable layers) is a filesystem of its own, a tmpfs, and whose state
// dir is another: ImageFsInfo reports the image and container filesystems
// apart (KEP-4191), each with its own usage; a container's writes count on
// the container filesystem only, its stats name that filesystem, and the
// whole lifecycle works and leaves nothing behind.
func TestSplitContainerFilesystem(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(cfg *config.Config) {
		mountTmpfs(t, filepath.Join(cfg.Root, "containers"))
		mountTmpfs(t, cfg.State)
	}})
	imagesDir, ctrsDir := filepath.Join(d.Root, "images"), filepath.Join(d.Root, "containers")
	if devOf(t, imagesDir) == devOf(t, ctrsDir) || devOf(t, ctrsDir) == devOf(t, d.State) {
		t.Fatal("the test's filesystems are not apart")
	}
	e := newCtrEnvOn(t, d)
	scope := leakcheck.ForDaemon(d)
	scope.Root = d.Root
	before := leakcheck.Take(t, scope)
	fsInfo := func() (img, ctr *criapi.FilesystemUsage) {
		t.Helper()
		resp, err := d.Image.ImageFsInfo(berthdtest.Ctx(t), &criapi.ImageFsInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.ImageFilesystems) != 1 || len(resp.ContainerFilesystems) != 1 {
			t.Fatalf("image filesystems %v, container filesystems %v; want one each", resp.ImageFilesystems, resp.ContainerFilesystems)
		}
		return resp.ImageFilesystems[0], resp.ContainerFilesystems[0]
	}
	img0, ctr0 := fsInfo()
	if img0.FsId.GetMountpoint() != imagesDir || ctr0.FsId.GetMountpoint() != ctrsDir {
		t.Fatalf("filesystems %q and %q, want %q and %q", img0.FsId.GetMountpoint(), ctr0.FsId.GetMountpoint(), imagesDir, ctrsDir)
	}

	const fill = 4 << 20
	id := e.create(e.config("writer", "sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=4 && touch /done && sleep 1000"))
	e.start(id)
	upper := filepath.Join(ctrsDir, id, "upper")
	var fs unix.Statfs_t
	if err := unix.Statfs(upper, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("the writable layer %s is not on the container filesystem (statfs type %#x, %v)", upper, fs.Type, err)
	}
	waitUntil(t, "the container's write (done in its writable layer)", func() bool { _, err := os.Stat(filepath.Join(upper, "done")); return err == nil })
	img1, ctr1 := fsInfo()
	if ctr1.UsedBytes.GetValue() < ctr0.UsedBytes.GetValue()+fill {
		t.Fatalf("container filesystem usage %d → %d after a %d-byte write", ctr0.UsedBytes.GetValue(), ctr1.UsedBytes.GetValue(), fill)
	}
	// Counted once: the walk does not enter the rootfs overlay, where the
	// same file (and the image's files) show again.
	if ctr1.UsedBytes.GetValue() >= ctr0.UsedBytes.GetValue()+fill+1<<20 {
		t.Fatalf("container filesystem usage %d → %d after a %d-byte write: the rootfs mount was walked", ctr0.UsedBytes.GetValue(), ctr1.UsedBytes.GetValue(), fill)
	}
	if img1.UsedBytes.GetValue() >= img0.UsedBytes.GetValue()+fill/2 {
		t.Fatalf("a container's write counted on the image filesystem: %d → %d", img0.UsedBytes.GetValue(), img1.UsedBytes.GetValue())
	}
	wl := containerStats(t, d, id).GetWritableLayer()
	if wl.GetFsId().GetMountpoint() != ctrsDir || wl.GetUsedBytes().GetValue() < fill {
		t.Fatalf("writable layer stats: %v", wl)
	}

	stopRemove(t, d, e.pod)
	if _, ctr2 := fsInfo(); ctr2.UsedBytes.GetValue() >= ctr1.UsedBytes.GetValue()-fill {
		t.Fatalf("container filesystem usage %d → %d after the container went", ctr1.UsedBytes.GetValue(), ctr2.UsedBytes.GetValue())
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
