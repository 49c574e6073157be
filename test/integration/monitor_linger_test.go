package integration

import (
	"os"
	"path/filepath"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/shim/shimfault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// TestNodeEndsWithItsLastContainerWhileTheKeeperLags: the keeper reads its
// monitor's link on one goroutine and reaps on another. When the node's
// last container is removed, the monitor tells the keeper to forget it
// and exits at once; a keeper that reaps the monitor before it applies
// that forget (its link goroutine not scheduled yet: a loaded machine)
// sees a container still held and must not take the clean exit for a
// crash, or its next monitor adopts the removed container and serves it
// for ever (decision 3300). The keeper-slow-link pause makes that
// interleaving certain: the keeper must apply everything its monitor
// said before it decides whether the monitor's exit was the node's end.
func TestNodeEndsWithItsLastContainerWhileTheKeeperLags(t *testing.T) {
	t.Parallel()
	faults := filepath.Join(t.TempDir(), "shim-faults")
	d := berthdtest.Start(t, berthdtest.Options{Env: []string{shimfault.EnvVar + "=" + faults}})
	e := newCtrEnvOn(t, d)
	scope, before := nodeLeakBaseline(t, e)
	waitNodeGone(t, d)

	pe := e.podEnv(podConfig("linger"))
	id := pe.run(pe.config("sleeper", "sleep", "3600"))
	keepers, monitors := oneKeeperOneMonitor(t, d)
	if err := shimfault.Arm(faults, shimfault.KeeperSlowLink); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Runtime.StopContainer(berthdtest.Ctx(t), &criapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if _, err := d.Runtime.RemoveContainer(berthdtest.Ctx(t), &criapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	// The pod's last container is gone: its monitor exits, and with it
	// the keeper. Any other monitor is the keeper's mistake.
	waitUntil(t, "the keeper to exit with the node's last container", func() bool {
		for _, m := range berthdtest.ShimPids(d.State, "monitor") {
			if m != monitors[0] {
				log, _ := os.ReadFile(filepath.Join(d.State, "shims", ".node", "shim.log"))
				t.Fatalf("keeper %d started monitor %d after the node's last container was removed:\n%s", keepers[0], m, log)
			}
		}
		return len(berthdtest.ShimPids(d.State, "keeper")) == 0
	})
	if err := os.Remove(faults); err != nil {
		t.Fatal(err)
	}
	stopRemove(t, d, pe.pod)
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
