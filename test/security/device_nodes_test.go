package security

import (
	"archive/tar"
	"slices"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestImageWithDeviceNodesRuns (decision 3420): an image whose layer
// holds /dev/console, /dev/null, /dev/zero … as character devices (what
// `docker import` of a debootstrap rootfs gives) is pulled and runs, as
// in containerd; the container's /dev is still the runtime's tmpfs, and a
// block device the image ships elsewhere cannot be opened (the device
// cgroup denies it). On b407862 the pull was refused ("device nodes are
// not allowed in layers").
func TestImageWithDeviceNodesRuns(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	devs := unpackTar(t, []*tar.Header{
		{Name: "dev/", Typeflag: tar.TypeDir},
		{Name: "dev/console", Typeflag: tar.TypeChar, Mode: 0o600, Devmajor: 5, Devminor: 1},
		{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		{Name: "dev/zero", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 5},
		{Name: "dev/ptmx", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 5, Devminor: 2},
		{Name: "dev/tty", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 5, Devminor: 0},
		{Name: "opt/", Typeflag: tar.TypeDir},
		{Name: "opt/disk", Typeflag: tar.TypeBlock, Mode: 0o666, Devmajor: 7, Devminor: 0},
	}, nil)
	img := unpackImage(t, []string{"sh", "-c",
		"echo hello-from-devimage; head -c 1 /opt/disk >/dev/null 2>&1 && echo disk-readable || echo disk-denied; " +
			"grep -q ' /dev tmpfs ' /proc/mounts && echo dev-tmpfs"},
		unpackLayerOf(t, devs))
	reg.Push(t, "devnodes:1", img)
	if err := unpackPull(t, d, reg.Ref("devnodes:1")); err != nil {
		t.Fatalf("pull of an image with device nodes: %v", err)
	}
	out := unpackRunOutput(t, d, reg.Ref("devnodes:1"))
	want := []string{"hello-from-devimage", "disk-denied", "dev-tmpfs"}
	if !slices.Equal(out, want) {
		t.Fatalf("container printed %q, want %q", out, want)
	}
}
