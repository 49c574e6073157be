package integration

import (
	"fmt"
	"sync"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The kubelet removes a pod's containers concurrently. The pod ends
// once the last one is gone, and each delete must still get its reply,
// not EOF (decision 1701).
func TestParallelRemovalOfAPodsLastContainers(t *testing.T) {
	e := newCtrEnv(t)
	for round := 0; round < 8; round++ {
		var ids []string
		for i := 0; i < 6; i++ {
			ids = append(ids, e.create(e.config(fmt.Sprintf("r%d-%d", round, i), "sleep", "100")))
		}
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = e.d.Runtime.RemoveContainer(berthdtest.Ctx(t), &criapi.RemoveContainerRequest{ContainerId: id})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d: remove %s: %v", round, ids[i], err)
			}
		}
	}
}
