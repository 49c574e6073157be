package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// BenchmarkCheckpointRestore measures checkpoint and restore of a small
// pod (KEP-2008, CheckpointPod/RestorePod, docs/checkpoint.md): two
// busybox containers, a shell counting in a loop and a shell serving TCP
// with nc. Each sample checkpoints the running pod into a fresh directory,
// restores it into a new sandbox (RestorePod: sandbox and two created
// containers) and starts both restored containers (CRIU's restore), then
// removes the restored pod. CheckpointContainer's archive of one
// container is measured too. Sizes are the checkpoint's bytes on disk.
// No reference runtime: containerd 1.6 has neither pod RPC.
func BenchmarkCheckpointRestore(b *testing.B) {
	berthdtest.RequireCRIU(b)
	reg := testimages.StartRegistry(b)
	reg.PushStandard(b)
	image := reg.Ref(testimages.BusyboxRef)
	ep := StartBerth(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if _, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: image}}); err != nil {
		b.Fatal(err)
	}
	pc := podConfig(ep, "ck")
	pod, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
	if err != nil {
		b.Fatal(err)
	}
	cfgs := []*criapi.ContainerConfig{
		containerConfig(image, "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"),
		containerConfig(image, "sh", "-c", "while true; do nc -l -p 8080 -e echo hi; done"),
	}
	var ids []string
	for _, c := range cfgs {
		r, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: c, SandboxConfig: pc})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ep.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: r.ContainerId}); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, r.ContainerId)
	}
	time.Sleep(time.Second)

	const samples = 10
	ckPod := Series{Name: "CheckpointPod (2 containers)"}
	restore := Series{Name: "RestorePod (sandbox + 2 created containers)"}
	start := Series{Name: "StartContainer of both restored (CRIU restore)"}
	ckCtr := Series{Name: "CheckpointContainer (1 container, tar archive)"}
	var podBytes, archiveBytes int64
	scratch := b.TempDir()
	for i := 0; i < warmup+samples; i++ {
		dir := filepath.Join(scratch, fmt.Sprintf("pod-%d", i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		dctx, dcancel := context.WithTimeout(ctx, 2*time.Minute)
		dck, err := timed(func() error {
			_, err := ep.Runtime.CheckpointPod(dctx, &criapi.CheckpointPodRequest{PodSandboxId: pod.PodSandboxId, OutputPath: dir, ContainerIds: ids})
			return err
		})
		if err != nil {
			b.Fatalf("CheckpointPod: %v", err)
		}
		rpc := podConfig(ep, "ckr")
		rpc.Hostname = pc.Hostname // the same pod, restored: the same hostname
		var resp *criapi.RestorePodResponse
		drs, err := timed(func() error {
			resp, err = ep.Runtime.RestorePod(dctx, &criapi.RestorePodRequest{CheckpointPath: dir, Config: rpc, ContainerConfigs: cfgs})
			return err
		})
		if err != nil {
			b.Fatalf("RestorePod: %v", err)
		}
		dst, err := timed(func() error {
			for _, rc := range resp.RestoredContainers {
				if _, err := ep.Runtime.StartContainer(dctx, &criapi.StartContainerRequest{ContainerId: rc.ContainerId}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatalf("start restored: %v", err)
		}
		if err := removePod(dctx, ep, resp.PodSandboxId); err != nil {
			b.Fatal(err)
		}
		loc := filepath.Join(scratch, fmt.Sprintf("ctr-%d.tar", i))
		dcc, err := timed(func() error {
			_, err := ep.Runtime.CheckpointContainer(dctx, &criapi.CheckpointContainerRequest{ContainerId: ids[0], Location: loc})
			return err
		})
		dcancel()
		if err != nil {
			b.Fatalf("CheckpointContainer: %v", err)
		}
		if i >= warmup {
			ckPod.Samples = append(ckPod.Samples, dck)
			restore.Samples = append(restore.Samples, drs)
			start.Samples = append(start.Samples, dst)
			ckCtr.Samples = append(ckCtr.Samples, dcc)
		}
		podBytes = diskBytes(b, dir)
		archiveBytes = diskBytes(b, loc)
		os.RemoveAll(dir)
		os.Remove(loc)
	}
	if err := removePod(ctx, ep, pod.PodSandboxId); err != nil {
		b.Error(err)
	}
	if err := Report(os.Stdout, "checkpoint", ckPod, restore, start, ckCtr); err != nil {
		b.Fatal(err)
	}
	sizes := map[string]int64{"pod_checkpoint_bytes": podBytes, "container_archive_bytes": archiveBytes}
	fmt.Printf("\n### checkpoint sizes\n\n| what | KiB |\n|---|---:|\n| CheckpointPod output (2 containers) | %d |\n| CheckpointContainer archive (1 container) | %d |\n",
		podBytes/1024, archiveBytes/1024)
	if dir := os.Getenv("BENCH_OUT"); dir != "" {
		data, _ := json.MarshalIndent(map[string]any{"benchmark": "checkpoint_size", "sizes": sizes, "time": time.Now().UTC()}, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "checkpoint_size.json"), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

// diskBytes sums the sizes of the regular files at or below path.
func diskBytes(b *testing.B, path string) int64 {
	var n int64
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}
