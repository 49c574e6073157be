package integration

import (
	"archive/tar"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// TestCheckpointContainerRestoreFromArchive restores one container from a
// CheckpointContainer archive through CreateContainer with the archive's
// path as the image (KEP-2008, as CRI-O does) into another pod, after the
// checkpointed container is gone: the shell's count goes on. Archives
// that are not checkpoints are InvalidArgument and leave nothing.
func TestCheckpointContainerRestoreFromArchive(t *testing.T) {
	berthdtest.RequireCRIU(t)
	e := newCtrEnv(t)
	id := e.run(e.config("counter", "sh", "-c", counterScript))
	before := e.waitCount(id, 10)
	loc := filepath.Join(t.TempDir(), "counter.tar")
	if _, err := e.d.Runtime.CheckpointContainer(berthdtest.Ctx(t), &criapi.CheckpointContainerRequest{ContainerId: id, Location: loc, Timeout: 60}); err != nil {
		t.Fatalf("CheckpointContainer: %v\n%s", err, e.d.Logs())
	}
	if _, err := e.d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: id, Timeout: 1}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if _, err := e.d.Runtime.RemoveContainer(berthdtest.Ctx(t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}

	podCfg := podConfig("ckpt-archive-restored")
	podCfg.Linux.CgroupParent = ""
	pe := e.podEnv(podCfg)
	// The request's command and image are not the checkpoint's: the
	// checkpoint's win.
	cfg := e.config("restored", "sleep", "1000")
	cfg.Image.Image = loc
	rid := pe.create(cfg)
	st := pe.status(rid)
	if st.State != criapi.ContainerState_CONTAINER_CREATED || st.Metadata.Name != "restored" || !strings.Contains(st.ImageRef, "sha256:") {
		t.Fatalf("restored container: %s, name %s, image ref %q", st.State, st.Metadata.Name, st.ImageRef)
	}
	pe.start(rid)
	c := pe.count(rid)
	if c < before {
		t.Fatalf("count after restore %d, before the checkpoint %d: the shell started over", c, before)
	}
	pe.waitCount(rid, c+3)
	if got := pe.exec(rid, "cat", "/data.txt"); got != "hello" {
		t.Fatalf("/data.txt = %q", got)
	}
	if _, err := os.Stat(loc); err != nil {
		t.Fatalf("the restore changed the archive: %v", err)
	}

	// Bad archives.
	scope := leakcheck.ForDaemon(e.d)
	snap := leakcheck.Take(t, scope)
	dir := t.TempDir()
	notTar := filepath.Join(dir, "not.tar")
	if err := os.WriteFile(notTar, []byte("not a tar archive\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noDumps := filepath.Join(dir, "nodumps.tar")
	writeTar(t, noDumps, map[string]string{"checkpoint/inventory.img": "x"})
	badJSON := filepath.Join(dir, "badjson.tar")
	writeTar(t, badJSON, map[string]string{"config.dump": "{", "spec.dump": "{}", "checkpoint/inventory.img": "x"})
	escape := filepath.Join(dir, "escape.tar")
	writeTar(t, escape, map[string]string{"config.dump": "{}", "spec.dump": "{}", "../../escaped": "x"})
	// The real archive cut short: its dumps are there, its images not.
	good, err := os.ReadFile(loc)
	if err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "truncated.tar")
	if err := os.WriteFile(truncated, good[:len(good)*2/3], 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{notTar, noDumps, badJSON, escape, truncated} {
		cfg := e.config("bad", "sleep", "1000")
		cfg.Image.Image = bad
		_, err := pe.d.Runtime.CreateContainer(berthdtest.Ctx(t), &criapi.CreateContainerRequest{PodSandboxId: pe.pod, Config: cfg, SandboxConfig: pe.podCfg})
		berthdtest.WantCode(t, err, codes.InvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "escaped")); err == nil {
		t.Fatalf("an archive name escaped the unpack dir")
	}
	resp, err := pe.d.Runtime.ListContainers(berthdtest.Ctx(t), &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{PodSandboxId: pe.pod}})
	if err != nil {
		t.Fatal(err)
	}
	if ids := slices.Collect(func(yield func(string) bool) {
		for _, c := range resp.Containers {
			if !yield(c.Id) {
				return
			}
		}
	}); !slices.Equal(ids, []string{rid}) {
		t.Fatalf("pod has containers %q after failed creates, want only %s", ids, rid)
	}
	time.Sleep(time.Second) // let undone work settle
	if leaks := leakcheck.Diff(snap, leakcheck.Take(t, scope)); len(leaks) > 0 {
		t.Fatalf("leaked %d items:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
	if es, _ := os.ReadDir(filepath.Join(e.d.Root, "checkpoints")); len(es) != 0 {
		t.Errorf("%d checkpoint unpack dirs left", len(es))
	}
	if got := pe.count(rid); got < c {
		t.Fatalf("restored counter went back to %d", got)
	}
}

// writeTar writes a tar archive of the named files.
func writeTar(t *testing.T, path string, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o600, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
