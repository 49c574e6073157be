package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// benchPods is how many pods each series measures.
const benchPods = 40

// BenchmarkSandboxLifecycle measures RunPodSandbox and
// StopPodSandbox+RemovePodSandbox on the embedded default network, next to
// the floor any CNI runtime pays for a pod: `ip netns add` plus the bridge
// plugin's ADD run directly with the same bridge config. The two are
// interleaved so both see the same node load.
func BenchmarkSandboxLifecycle(b *testing.B) {
	d := berthdtest.Start(b, berthdtest.Options{})
	ctx := context.Background()
	cniBin, err := FindCNIBin(d.Config.CNIBinDirs)
	if err != nil {
		b.Skip(err)
	}
	ipamDir := filepath.Join(d.Root, "cni", "networks")
	bridgeConf, err := BridgePluginConf(network.DefaultConfList(d.Config.DefaultNetwork.Bridge, d.Config.DefaultNetwork.Subnet, ipamDir))
	if err != nil {
		b.Fatal(err)
	}

	run := Series{Name: "RunPodSandbox"}
	stopRemove := Series{Name: "StopPodSandbox+RemovePodSandbox"}
	floor := Series{Name: "floor: ip netns add + bridge ADD"}
	var ids []string
	type floorPod struct{ ns, id string }
	var floors []floorPod
	defer func() {
		for _, f := range floors {
			RunBridgePlugin(cniBin, "DEL", f.id, "/run/netns/"+f.ns, bridgeConf)
			_ = exec.Command("ip", "netns", "del", f.ns).Run()
		}
	}()
	for i := 0; i < benchPods+2; i++ {
		ns := fmt.Sprintf("berthbench-%d-%d", os.Getpid(), i)
		cid := fmt.Sprintf("floor%d%d", os.Getpid(), i)
		start := time.Now()
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			b.Fatalf("ip netns add: %v %s", err, out)
		}
		floors = append(floors, floorPod{ns, cid})
		if out, err := RunBridgePlugin(cniBin, "ADD", cid, "/run/netns/"+ns, bridgeConf); err != nil {
			b.Fatalf("bridge ADD: %v %s", err, out)
		}
		floorTime := time.Since(start)

		cfg := &criapi.PodSandboxConfig{
			Metadata: &criapi.PodSandboxMetadata{Name: fmt.Sprintf("bench-%d", i), Namespace: "bench", Uid: fmt.Sprintf("uid-%d", i)},
			Hostname: fmt.Sprintf("bench-%d", i),
			Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
			}},
		}
		start = time.Now()
		resp, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			b.Fatalf("RunPodSandbox: %v", err)
		}
		runTime := time.Since(start)
		ids = append(ids, resp.PodSandboxId)
		if i >= 2 { // the first two warm up: bridge creation, page cache
			floor.Samples = append(floor.Samples, floorTime)
			run.Samples = append(run.Samples, runTime)
		}
	}
	for i, id := range ids {
		start := time.Now()
		if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			b.Fatalf("StopPodSandbox: %v", err)
		}
		if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			b.Fatalf("RemovePodSandbox: %v", err)
		}
		if i >= 2 {
			stopRemove.Samples = append(stopRemove.Samples, time.Since(start))
		}
	}
	if err := Report(os.Stdout, "sandbox_lifecycle", run, stopRemove, floor); err != nil {
		b.Fatal(err)
	}
	ratio := float64(run.Summary().P50ms) / float64(floor.Summary().P50ms)
	fmt.Printf("\nRunPodSandbox p50 / floor p50 = %.2f (target ≤ 2.5)\n", ratio)
}
