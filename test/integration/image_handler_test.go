package integration

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestImagesAreSharedByRuntimeHandlers checks the KEP-4216 rule berth
// implements (docs/decisions/1502): ImageSpec.runtime_handler names a
// configured handler or the call is refused with InvalidArgument; an image
// pulled for one handler is the image of every handler (one ID, one entry,
// downloaded once, no handler in Image.spec), runs in a pod of another
// handler, and RemoveImage for one handler removes it for all.
func TestImagesAreSharedByRuntimeHandlers(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(cfg *config.Config) {
		cfg.RuntimeHandlers = map[string]config.RuntimeHandler{"other": {Binary: cfg.Runtime}}
	}})
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	ref := reg.Ref(testimages.BusyboxRef)
	ctx := berthdtest.Ctx(t)
	spec := func(handler string) *criapi.ImageSpec {
		return &criapi.ImageSpec{Image: ref, RuntimeHandler: handler}
	}

	// Unknown handlers are refused by all four RPCs, and nothing is pulled.
	refused := map[string]func() error{
		"PullImage": func() error {
			_, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: spec("nope")})
			return err
		},
		"ImageStatus": func() error {
			_, err := d.Image.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: spec("nope")})
			return err
		},
		"ListImages": func() error {
			_, err := d.Image.ListImages(ctx, &criapi.ListImagesRequest{Filter: &criapi.ImageFilter{Image: spec("nope")}})
			return err
		},
		"RemoveImage": func() error {
			_, err := d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: spec("nope")})
			return err
		},
	}
	for rpc, call := range refused {
		if err := call(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s with an unknown runtime handler: %v, want InvalidArgument", rpc, err)
		}
	}
	if imageStatus(t, d, ref) != nil {
		t.Fatal("a pull for an unknown handler stored the image")
	}

	// Pulled for "other", it is the default handler's image too.
	resp, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: spec("other")})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ImageRef
	for _, h := range []string{"", "runc", "other"} {
		st, err := d.Image.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: spec(h)})
		if err != nil || st.GetImage().GetId() != id {
			t.Fatalf("ImageStatus for handler %q: %v, %v; want %s", h, st.GetImage(), err, id)
		}
	}
	again, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: spec("runc")})
	if err != nil || again.ImageRef != id {
		t.Fatalf("pull for the default handler: %v, %v; want %s", again, err, id)
	}
	img := mustImage(t, testimages.Busybox)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	if n := reg.BlobFetches(ld.String()); n != 1 {
		t.Fatalf("layer fetched %d times for two handlers, want once", n)
	}
	list, err := d.Image.ListImages(ctx, &criapi.ListImagesRequest{Filter: &criapi.ImageFilter{Image: spec("other")}})
	if err != nil || len(list.Images) != 1 || list.Images[0].Id != id || list.Images[0].GetSpec().GetRuntimeHandler() != "" {
		t.Fatalf("ListImages for handler other: %v, %v; want one image without a handler", list.GetImages(), err)
	}
	all, err := d.Image.ListImages(ctx, &criapi.ListImagesRequest{})
	if err != nil || len(all.Images) != 1 {
		t.Fatalf("ListImages: %v, %v; want one image for both handlers", all.GetImages(), err)
	}

	// A pod of the other handler runs it.
	podCfg := podConfig("other-handler")
	podCfg.LogDirectory = filepath.Join(d.Dir, "podlogs")
	podCfg.Linux.CgroupParent = ""
	pod, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: podCfg, RuntimeHandler: "other"})
	if err != nil {
		t.Fatal(err)
	}
	e := &ctrEnv{t: t, d: d, reg: reg, pod: pod.PodSandboxId, podCfg: podCfg}
	ctr := e.create(e.config("c", "sleep", "1000"))
	e.start(ctr)

	// Removed for one handler, it is gone for all.
	if _, err := d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: spec("runc")}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"", "other"} {
		if st, err := d.Image.ImageStatus(context.Background(), &criapi.ImageStatusRequest{Image: spec(h)}); err != nil || st.Image != nil {
			t.Fatalf("ImageStatus for handler %q after removal: %v, %v", h, st.GetImage(), err)
		}
	}
	if st := e.status(ctr); st.State != criapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the container of the removed image is %v", st.State)
	}
	stopRemove(t, d, pod.PodSandboxId)
}
