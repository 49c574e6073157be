package security

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// CVE-2026-41579: an image whose /dev is a symlink to a host directory.
// runc before 1.3.6 and 1.4.3 removes ptmx and creates its /dev symlinks
// (fd, stdin, stdout, stderr, ptmx) by a plain join of the rootfs path,
// following the link to the host. berth makes such a /dev a plain
// directory before runc runs, so whatever the runc, the host directory
// keeps its ptmx and gains nothing, and the container runs with its usual
// /dev.
func TestImageDevSymlinkLeavesHostDirectoryAlone(t *testing.T) {
	host, err := os.MkdirTemp("", "berth-devlink-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(host) })
	if err := os.WriteFile(filepath.Join(host, "ptmx"), []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	e := startPhEnv(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	built, err := testimages.Build([][]testimages.File{{{Name: "dev", Symlink: host}}}, v1.Config{Cmd: []string{"sleep", "600"}})
	img := testimages.Must(t, built, err)
	reg.Push(t, "devlink:1", img)
	ref := reg.Ref("devlink:1")
	if _, err := e.d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull: %v", err)
	}
	ns := &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER}
	pod, podID := e.runPod(t, "devlink", ns)
	ctr := e.container("devlink", ns)
	ctr.Image = &criapi.ImageSpec{Image: ref}
	ctr.Command = nil
	id := e.runContainer(t, podID, pod, ctr)

	entries, err := os.ReadDir(host)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range entries {
		names = append(names, de.Name())
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "ptmx" {
		t.Errorf("the host directory the image's /dev points at now holds %v, want only ptmx", names)
	}
	if data, err := os.ReadFile(filepath.Join(host, "ptmx")); err != nil || string(data) != "host file\n" {
		t.Errorf("host ptmx: %q, %v; want it untouched", data, err)
	}
	// The container has the usual /dev: a tmpfs with the runtime's links.
	out, code := e.sh(t, id, "test -L /dev/fd && test -e /dev/null && grep -q ' /dev tmpfs ' /proc/mounts && echo dev-ok")
	if code != 0 || !strings.Contains(out, "dev-ok") {
		t.Errorf("container /dev: exit %d %q", code, out)
	}
}
