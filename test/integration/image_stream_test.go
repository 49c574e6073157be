package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// waitStoreEmpty waits until a failed pull's layer streams, which end
// after the RPC answered, have removed what they wrote.
func waitStoreEmpty(t *testing.T, d *berthdtest.Daemon) {
	t.Helper()
	waitUntil(t, "a failed pull's store to empty", func() error {
		var left []string
		for _, sub := range []string{"ingest", "layers", "blobs/sha256", "records", "trash"} {
			for _, e := range dirEntries(t, d, sub) {
				left = append(left, sub+"/"+e)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %v", left)
		}
		return nil
	})
}

// TestImagePullLayerDigestFailureUndoesLayers arms the layer digest check
// to fail (fail-layer-digest): each layer has streamed into ingest/ and
// been unpacked there when its check fails. PullImage is InvalidArgument,
// and no half layer, blob, record or ingest file stays behind.
func TestImagePullLayerDigestFailureUndoesLayers(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{Env: []string{fault.EnvVar + "=" + string(fault.ImageFailLayerDigest)}})
	scope, before := storeLeakScope(t, d)

	ref := reg.Ref(testimages.MultiLayerRef)
	_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(err.Error(), "digest") {
		t.Fatalf("error does not name the digest check: %v", err)
	}
	waitStoreEmpty(t, d)
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Fatalf("images after a failed pull: %v", imgs)
	}
	leakcheck.Check(t, before, leakcheck.Take(t, scope))

	d.Kill()
	d.SetEnv()
	d.Start()
	d.WaitReady()
	if id := pull(t, d, ref, nil); id != configDigest(t, mustImage(t, testimages.MultiLayer)) {
		t.Fatalf("pull without the fault: %s", id)
	}
}

// TestImagePullStalledRegistryTimesOut serves a layer halfway and then
// nothing. The kubelet sets no deadline on PullImage: berthd's
// image_pull_progress_timeout ends the pull with DeadlineExceeded, and it
// leaves nothing behind.
func TestImagePullStalledRegistryTimesOut(t *testing.T) {
	t.Parallel()
	reg, _, ld := multiLayerRegistry(t)
	hold := reg.HoldBlob(t, ld)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.ImagePullProgressTimeout = config.Duration(time.Second)
	}})
	scope, before := storeLeakScope(t, d)

	// No deadline of its own, as the kubelet's.
	_, err := d.Image.PullImage(context.Background(), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.MultiLayerRef)}})
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
	if !strings.Contains(err.Error(), "image_pull_progress_timeout") {
		t.Fatalf("error does not name the setting: %v", err)
	}
	select {
	case <-hold.Arrived:
	default:
		t.Fatal("the pull never reached the stalled layer")
	}
	waitStoreEmpty(t, d)
	leakcheck.Check(t, before, leakcheck.Take(t, scope))
	hold.Release()
	pull(t, d, reg.Ref(testimages.MultiLayerRef), nil)
}
