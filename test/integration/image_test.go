package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

func TestImagePullByTagThenRemoveByOtherTagRemovesAll(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	digests := reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref, alt := reg.Ref(testimages.BusyboxRef), reg.Ref(testimages.BusyboxAltRef)

	id := pull(t, d, ref, nil)
	img := imageStatus(t, d, ref)
	if img == nil || img.Id != id {
		t.Fatalf("status after pull: %+v, want id %s", img, id)
	}
	wantDigest := reg.Host + "/busybox@" + digests[testimages.BusyboxRef].String()
	if !slices.Equal(img.RepoTags, []string{ref}) || !slices.Equal(img.RepoDigests, []string{wantDigest}) {
		t.Fatalf("RepoTags %v RepoDigests %v; want [%s] [%s]", img.RepoTags, img.RepoDigests, ref, wantDigest)
	}
	if img.Size == 0 {
		t.Fatal("image size is 0")
	}
	// Every kind of reference names the same image (critest checks this).
	for _, r := range []string{id, strings.TrimPrefix(id, "sha256:"), id[:19], strings.TrimPrefix(id, "sha256:")[:12], wantDigest} {
		if got := imageStatus(t, d, r); got == nil || got.Id != id {
			t.Fatalf("status by %q: %+v", r, got)
		}
	}
	if id2 := pull(t, d, alt, nil); id2 != id {
		t.Fatalf("second tag of the same image got ID %s, want %s", id2, id)
	}
	img = imageStatus(t, d, ref)
	if !sameSet(img.RepoTags, []string{ref, alt}) {
		t.Fatalf("RepoTags after pulling both tags: %v", img.RepoTags)
	}
	if n := len(listImages(t, d)); n != 1 {
		t.Fatalf("%d images listed, want 1", n)
	}
	filtered, err := d.Image.ListImages(berthdtest.Ctx(t), &criapi.ListImagesRequest{Filter: &criapi.ImageFilter{Image: &criapi.ImageSpec{Image: alt}}})
	if err != nil || len(filtered.Images) != 1 || filtered.Images[0].Id != id {
		t.Fatalf("filtered list: %v %v", filtered, err)
	}
	filtered, err = d.Image.ListImages(berthdtest.Ctx(t), &criapi.ListImagesRequest{Filter: &criapi.ImageFilter{Image: &criapi.ImageSpec{Image: reg.Ref("nothing:here")}}})
	if err != nil || len(filtered.Images) != 0 {
		t.Fatalf("filter naming no image: %v %v", filtered, err)
	}

	// One tag removes the image with all its tags and digests.
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: alt}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{ref, alt, id, wantDigest} {
		if got := imageStatus(t, d, r); got != nil {
			t.Fatalf("status by %q after remove: %+v", r, got)
		}
	}
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Fatalf("images left after remove: %v", imgs)
	}
	if l := dirEntries(t, d, "layers"); len(l) != 0 {
		t.Fatalf("layers left after remove: %v", l)
	}
	if b := dirEntries(t, d, "blobs/sha256"); len(b) != 0 {
		t.Fatalf("blobs left after remove: %v", b)
	}
	// Idempotent: removing what is gone succeeds.
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	_, err = d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{}})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
}

func TestImageRemoveByIDAndByDigest(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	digests := reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref := reg.Ref(testimages.UserRef)
	byDigest := reg.Host + "/busybox-user@" + digests[testimages.UserRef].String()

	id := pull(t, d, ref, nil)
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: id}}); err != nil {
		t.Fatal(err)
	}
	if imageStatus(t, d, ref) != nil {
		t.Fatal("image still there after remove by ID")
	}
	pull(t, d, ref, nil)
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: byDigest}}); err != nil {
		t.Fatal(err)
	}
	if imageStatus(t, d, ref) != nil || imageStatus(t, d, id) != nil {
		t.Fatal("image still there after remove by digest")
	}
}

func TestImagePullByDigestHasNoTag(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	digests := reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref := reg.Host + "/busybox@" + digests[testimages.BusyboxRef].String()

	id := pull(t, d, ref, nil)
	img := imageStatus(t, d, ref)
	if img == nil || img.Id != id || len(img.RepoTags) != 0 || !slices.Equal(img.RepoDigests, []string{ref}) {
		t.Fatalf("pulled by digest: %+v; want no tags and RepoDigests [%s]", img, ref)
	}
	if imageStatus(t, d, reg.Ref(testimages.BusyboxRef)) != nil {
		t.Fatal("a digest pull must not create a tag")
	}
}

func writeHostsToml(t *testing.T, d *berthdtest.Daemon, host, content string) {
	t.Helper()
	dir := filepath.Join(d.Config.RegistryConfigDir, host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestImagePullShortNameThroughDockerHubMirror(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	img := mustImage(t, testimages.Busybox)
	dgst := reg.Push(t, "library/busybox:latest", img)
	d := berthdtest.Start(t, berthdtest.Options{})
	writeHostsToml(t, d, "docker.io", fmt.Sprintf(`server = "https://registry-1.docker.io"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, reg.Host))

	id := pull(t, d, "busybox", nil)
	if id != configDigest(t, img) {
		t.Fatalf("ID %s, want config digest %s", id, configDigest(t, img))
	}
	st := imageStatus(t, d, "busybox")
	if st == nil || !slices.Equal(st.RepoTags, []string{"docker.io/library/busybox:latest"}) ||
		!slices.Equal(st.RepoDigests, []string{"docker.io/library/busybox@" + dgst.String()}) {
		t.Fatalf("short-name pull status: %+v", st)
	}
	for _, r := range []string{"busybox:latest", "library/busybox", "docker.io/library/busybox:latest", "index.docker.io/library/busybox"} {
		if got := imageStatus(t, d, r); got == nil || got.Id != id {
			t.Fatalf("status by %q: %+v", r, got)
		}
	}
}

func TestImageMirrorFallsBackInOrderToUpstream(t *testing.T) {
	t.Parallel()
	upstream := testimages.StartRegistry(t)
	upstream.PushStandard(t)
	empty := testimages.StartRegistry(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	// A dead mirror, then one without the image, then the upstream.
	writeHostsToml(t, d, upstream.Host, fmt.Sprintf(`server = "http://%s"

[host."http://127.0.0.1:1"]
  capabilities = ["pull", "resolve"]

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, upstream.Host, empty.Host))
	pull(t, d, upstream.Ref(testimages.BusyboxRef), nil)
	if st := imageStatus(t, d, upstream.Ref(testimages.BusyboxRef)); st == nil {
		t.Fatal("no image after fallback pull")
	}
}

func TestImageMirrorIsPreferredOverUpstream(t *testing.T) {
	t.Parallel()
	mirror := testimages.StartRegistry(t)
	mirror.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	// The upstream is unreachable: only the mirror can serve the pull.
	writeHostsToml(t, d, "registry.example.invalid", fmt.Sprintf(`server = "http://127.0.0.1:1"

[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, mirror.Host))
	img := mustImage(t, testimages.Busybox)
	id := pull(t, d, "registry.example.invalid/busybox:latest", nil)
	if id != configDigest(t, img) {
		t.Fatalf("ID %s, want %s", id, configDigest(t, img))
	}
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	if n := mirror.BlobFetches(ld.String()); n != 1 {
		t.Fatalf("mirror served the layer %d times, want 1", n)
	}
}

func TestImagePullMultiArchIndexPicksThisPlatform(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	idx, native, err := testimages.MultiArch()
	if err != nil {
		t.Fatal(err)
	}
	idxDigest := reg.PushIndex(t, "multi:latest", idx)
	d := berthdtest.Start(t, berthdtest.Options{})
	id := pull(t, d, reg.Ref("multi:latest"), nil)
	if id != configDigest(t, native) {
		t.Fatalf("pulled %s, want the native image %s", id, configDigest(t, native))
	}
	st := imageStatus(t, d, reg.Ref("multi:latest"))
	if want := reg.Host + "/multi@" + idxDigest.String(); !slices.Equal(st.RepoDigests, []string{want}) {
		t.Fatalf("RepoDigests %v, want [%s] (the index digest)", st.RepoDigests, want)
	}
}

func TestImageBasicAuthRegistry(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t, testimages.WithBasicAuth("alice", "s3cret"))
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref := reg.Ref(testimages.BusyboxRef)
	for name, auth := range map[string]*criapi.AuthConfig{
		"none":           nil,
		"wrong password": {Username: "alice", Password: "nope"},
		"wrong auth":     {Auth: base64.StdEncoding.EncodeToString([]byte("alice:nope"))},
	} {
		_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}, Auth: auth})
		if name == "none" {
			if err == nil {
				t.Fatalf("%s: pull without credentials succeeded", name)
			}
		} else {
			berthdtest.WantCode(t, err, codes.Unauthenticated)
		}
	}
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Fatalf("refused pulls stored images: %v", imgs)
	}
	if b := dirEntries(t, d, "blobs/sha256"); len(b) != 0 {
		t.Fatalf("refused pulls left blobs: %v", b)
	}
	pull(t, d, ref, &criapi.AuthConfig{Username: "alice", Password: "s3cret"})
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err != nil {
		t.Fatal(err)
	}
	pull(t, d, ref, &criapi.AuthConfig{Auth: base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))})
}

func TestImageConcurrentPullsShareOneDownload(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	img := mustImage(t, testimages.MultiLayer)
	ref := reg.Ref(testimages.MultiLayerRef)

	var wg sync.WaitGroup
	ids := make([]string, 20)
	errs := make([]error, 20)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
			errs[i] = err
			if err == nil {
				ids[i] = resp.ImageRef
			}
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil || ids[i] != configDigest(t, img) {
			t.Fatalf("pull %d: id %q err %v", i, ids[i], errs[i])
		}
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		dg, _ := l.Digest()
		if n := reg.BlobFetches(dg.String()); n != 1 {
			t.Fatalf("layer %s fetched %d times by 20 concurrent pulls, want 1", dg, n)
		}
	}
	if n := reg.BlobFetches(configDigest(t, img)); n != 1 {
		t.Fatalf("config fetched %d times, want 1", n)
	}
}

func TestImagePullKilledMidwayLeavesNothingAfterRestart(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	img := mustImage(t, testimages.MultiLayer)
	layers, _ := img.Layers()
	last, _ := layers[len(layers)-1].Digest()
	hold := reg.HoldBlob(t, last.String())

	ref := reg.Ref(testimages.MultiLayerRef)
	pullErr := make(chan error, 1)
	go func() {
		_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
		pullErr <- err
	}()
	select {
	case <-hold.Arrived:
	case <-time.After(time.Minute):
		t.Fatal("pull never reached the last layer")
	}
	arrived := time.Now()
	// Half a blob is in ingest/, streamed half into its unpacked layer
	// there, and earlier layers are unpacked: crash now.
	if len(dirEntries(t, d, "layers")) == 0 {
		t.Fatal("expected earlier layers unpacked before the stalled one")
	}
	for half := false; !half; time.Sleep(10 * time.Millisecond) {
		// The stream makes its ingest files once the response began.
		for _, e := range dirEntries(t, d, "ingest") {
			half = half || strings.HasPrefix(e, "layer-")
		}
		if !half && time.Since(arrived) > 10*time.Second {
			t.Fatalf("no half-unpacked layer in ingest: %v", dirEntries(t, d, "ingest"))
		}
	}
	d.Kill()
	if err := <-pullErr; err == nil {
		t.Fatal("pull succeeded although berthd was killed")
	}
	d.Start()
	d.WaitReady()
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Fatalf("images visible after a killed pull: %v", imgs)
	}
	for _, sub := range []string{"ingest", "layers", "blobs/sha256", "records"} {
		if left := dirEntries(t, d, sub); len(left) != 0 {
			t.Fatalf("%s not cleaned after restart: %v", sub, left)
		}
	}
	hold.Release()
	if id := pull(t, d, ref, nil); id != configDigest(t, img) {
		t.Fatalf("pull after restart: %s", id)
	}
}

func TestImagePullDeadlineExceeded(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	img := mustImage(t, testimages.Busybox)
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	reg.HoldBlob(t, ld.String())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.BusyboxRef)}})
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err = d.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.UserRef)}})
	berthdtest.WantCode(t, err, codes.DeadlineExceeded)
	if imgs := listImages(t, d); len(imgs) != 0 {
		t.Fatalf("timed-out pulls left images: %v", imgs)
	}
	// The abandoned pull is cancelled and cleans up after itself.
	waitUntil(t, "the timed-out pulls to remove what they wrote", func() error {
		if blobs, ingest := dirEntries(t, d, "blobs/sha256"), dirEntries(t, d, "ingest"); len(blobs)+len(ingest) != 0 {
			return fmt.Errorf("blobs %v ingest %v", blobs, ingest)
		}
		return nil
	})
}

func TestImageStatusUserPinnedAndVerboseConfig(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{Configure: func(c *config.Config) {
		c.PinnedImages = []string{reg.Ref(testimages.UIDRef)}
	}})
	pull(t, d, reg.Ref(testimages.UserRef), nil)
	pull(t, d, reg.Ref(testimages.UIDRef), nil)
	user := imageStatus(t, d, reg.Ref(testimages.UserRef))
	if user.Username != testimages.TestUser || user.Uid != nil || user.Pinned {
		t.Fatalf("USER berthuser image: username %q uid %v pinned %v", user.Username, user.Uid, user.Pinned)
	}
	uid := imageStatus(t, d, reg.Ref(testimages.UIDRef))
	if uid.Uid.GetValue() != testimages.TestUID || uid.Username != "" || !uid.Pinned {
		t.Fatalf("USER 1000:1000 image: username %q uid %v pinned %v", uid.Username, uid.Uid, uid.Pinned)
	}
	resp, err := d.Image.ImageStatus(berthdtest.Ctx(t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: uid.Id}, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		ImageSpec struct {
			Config struct{ User string }
		} `json:"imageSpec"`
	}
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil || info.ImageSpec.Config.User != "1000:1000" {
		t.Fatalf("verbose info %q: %v", resp.Info["info"], err)
	}
	resp, err = d.Image.ImageStatus(berthdtest.Ctx(t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: reg.Ref("absent:1")}})
	if err != nil || resp.Image != nil {
		t.Fatalf("status of an absent image: %+v %v", resp, err)
	}
}

func TestImageMultiLayerUnpacksOverlayWhiteouts(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	pull(t, d, reg.Ref(testimages.MultiLayerRef), nil)
	var sawWhiteout, sawOpaque, sawHardlink bool
	for _, l := range dirEntries(t, d, "layers") {
		diff := filepath.Join(d.Root, "images", "layers", l, "diff")
		var st unix.Stat_t
		if _, err := os.Lstat(filepath.Join(diff, "data", ".wh.gone")); err == nil {
			t.Fatalf("OCI whiteout file left in layer %s", l)
		}
		if err := unix.Lstat(filepath.Join(diff, "data", "gone"), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
			if st.Rdev != 0 {
				t.Fatalf("data/gone in layer %s is a device %d, not an overlay whiteout", l, st.Rdev)
			}
			sawWhiteout = true
		}
		buf := make([]byte, 8)
		if n, err := unix.Lgetxattr(filepath.Join(diff, "opaque"), "trusted.overlay.opaque", buf); err == nil && string(buf[:n]) == "y" {
			sawOpaque = true
		}
		if err := unix.Lstat(filepath.Join(diff, "data", "hard"), &st); err == nil && st.Nlink == 2 {
			sawHardlink = true
		}
	}
	if !sawWhiteout || !sawOpaque || !sawHardlink {
		t.Fatalf("whiteout %v opaque %v hardlink %v", sawWhiteout, sawOpaque, sawHardlink)
	}
}

func TestImageFsInfoReportsStoreUsage(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t)
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	fsInfo := func() *criapi.FilesystemUsage {
		resp, err := d.Image.ImageFsInfo(berthdtest.Ctx(t), &criapi.ImageFsInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.ImageFilesystems) != 1 {
			t.Fatalf("image filesystems: %v", resp.ImageFilesystems)
		}
		// The writable layers' filesystem, apart (KEP-4191); here on the
		// same disk, which the kubelet sees by resolving both to a device.
		if cf := resp.ContainerFilesystems; len(cf) != 1 || cf[0].FsId.GetMountpoint() != filepath.Join(d.Root, "containers") {
			t.Fatalf("container filesystems: %v", cf)
		}
		return resp.ImageFilesystems[0]
	}
	before := fsInfo()
	if before.FsId.GetMountpoint() != filepath.Join(d.Root, "images") || before.Timestamp == 0 {
		t.Fatalf("fs info: %+v", before)
	}
	pull(t, d, reg.Ref(testimages.BusyboxRef), nil)
	after := fsInfo()
	bb, err := os.Stat(testimages.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	if after.UsedBytes.GetValue() < before.UsedBytes.GetValue()+uint64(bb.Size()) ||
		after.InodesUsed.GetValue() < before.InodesUsed.GetValue()+uint64(len(testimages.Applets)) {
		t.Fatalf("usage before %v/%v after %v/%v", before.UsedBytes, before.InodesUsed, after.UsedBytes, after.InodesUsed)
	}
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: reg.Ref(testimages.BusyboxRef)}}); err != nil {
		t.Fatal(err)
	}
	if gone := fsInfo(); gone.UsedBytes.GetValue() >= after.UsedBytes.GetValue() || gone.InodesUsed.GetValue() >= after.InodesUsed.GetValue() {
		t.Fatalf("usage did not drop after remove: %v/%v then %v/%v", after.UsedBytes, after.InodesUsed, gone.UsedBytes, gone.InodesUsed)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestImagePullOnlyMirrorServesBlobsAfterTrustedResolve(t *testing.T) {
	t.Parallel()
	upstream := testimages.StartRegistry(t)
	upstream.PushStandard(t)
	mirror := testimages.StartRegistry(t)
	mirror.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	// The mirror may serve content but not resolve tags; the upstream
	// resolves busybox:latest to a digest, the mirror then serves it.
	writeHostsToml(t, d, upstream.Host, fmt.Sprintf(`server = "http://%s"

[host."http://%s"]
  capabilities = ["pull"]
`, upstream.Host, mirror.Host))
	img := mustImage(t, testimages.Busybox)
	ref := upstream.Ref(testimages.BusyboxRef)
	if id := pull(t, d, ref, nil); id != configDigest(t, img) {
		t.Fatalf("ID %s", id)
	}
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	if m, u := mirror.BlobFetches(ld.String()), upstream.BlobFetches(ld.String()); m != 1 || u != 0 {
		t.Fatalf("layer fetched %d times from the mirror and %d from upstream; want 1 and 0", m, u)
	}
	if st := imageStatus(t, d, ref); st == nil || !slices.Equal(st.RepoTags, []string{ref}) {
		t.Fatalf("status: %+v", st)
	}
}

func TestImageHostsTomlTLSCAAndSkipVerify(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t, testimages.WithTLS())
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref := reg.Ref(testimages.BusyboxRef)

	// Self-signed and not trusted: refused.
	writeHostsToml(t, d, reg.Host, fmt.Sprintf("server = \"https://%s\"\n", reg.Host))
	if _, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}}); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("pull from an untrusted TLS registry: %v", err)
	}
	// Trusted through ca = "…" relative to the hosts.toml dir.
	if err := os.WriteFile(filepath.Join(d.Config.RegistryConfigDir, reg.Host, "reg-ca.pem"), reg.CACertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	writeHostsToml(t, d, reg.Host, fmt.Sprintf("server = \"https://%s\"\nca = \"reg-ca.pem\"\n", reg.Host))
	id := pull(t, d, ref, nil)
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: id}}); err != nil {
		t.Fatal(err)
	}
	// skip_verify on a mirror host entry.
	writeHostsToml(t, d, "tls.example.invalid", fmt.Sprintf("server = \"https://127.0.0.1:1\"\n[host.\"https://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n", reg.Host))
	if got := pull(t, d, "tls.example.invalid/busybox:latest", nil); got != id {
		t.Fatalf("skip_verify pull got %s, want %s", got, id)
	}
}

func TestImageTokenAuthRegistry(t *testing.T) {
	t.Parallel()
	reg := testimages.StartRegistry(t, testimages.WithTokenAuth("identity-abc", "registry-xyz"))
	reg.PushStandard(t)
	d := berthdtest.Start(t, berthdtest.Options{})
	ref := reg.Ref(testimages.BusyboxRef)
	for name, auth := range map[string]*criapi.AuthConfig{
		"wrong registry token": {RegistryToken: "nope"},
		"wrong identity token": {IdentityToken: "nope"},
	} {
		_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}, Auth: auth})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%s: got %v, want Unauthenticated", name, err)
		}
	}
	id := pull(t, d, ref, &criapi.AuthConfig{RegistryToken: "registry-xyz"})
	if _, err := d.Image.RemoveImage(berthdtest.Ctx(t), &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: id}}); err != nil {
		t.Fatal(err)
	}
	if got := pull(t, d, ref, &criapi.AuthConfig{IdentityToken: "identity-abc"}); got != id {
		t.Fatalf("identity-token pull got %s, want %s", got, id)
	}
}
