package soak

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

// waitUntil polls cond every 500 ms for up to bound.
func waitUntil(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(500 * time.Millisecond)
	}
	return true
}

// teardown removes every pod as the kubelet would (manifests gone, its
// garbage collection removes the sandboxes), then checks what is left:
// the node's processes, the image store against its own accounting and
// its images, and, once every image is removed, everything the leak
// checks' scopes cover.
func teardown(t *testing.T, n *node, r *report) {
	start := time.Now()
	defer func() {
		r.TeardownS = time.Since(start).Seconds()
		if err := os.MkdirAll(n.p.Out, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(n.p.Out, "berthd.log"), []byte(n.d.Logs()), 0o644)
			_ = os.WriteFile(filepath.Join(n.p.Out, "kubelet.log"), []byte(n.k.Log()), 0o644)
		}
	}()
	ctx := context.Background()
	if err := r.w.removeAll(); err != nil {
		t.Fatal(err)
	}
	if !waitUntil(3*time.Minute, func() bool {
		pods, err := n.k.Pods()
		return err == nil && len(pods) == 0
	}) {
		r.addFinding(fmt.Errorf("the kubelet still lists pods 3 minutes after their manifests went"))
	}
	var left int
	// The kubelet removes stopped sandboxes in its garbage collection,
	// once a minute.
	if !waitUntil(3*time.Minute, func() bool {
		sbs, err1 := n.d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
		ctrs, err2 := n.d.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
		if err1 != nil || err2 != nil {
			return false
		}
		left = len(sbs.Items) + len(ctrs.Containers)
		return left == 0
	}) {
		// Not berth's to answer for: removed here, counted in the report.
		r.KubeletLeftPods = left
		n.removeLeftPods(nil)
	}
	if !waitUntil(time.Minute, func() bool {
		return len(berthdtest.ShimPids(n.d.State, "keeper"))+len(berthdtest.ShimPids(n.d.State, "monitor")) == 0
	}) {
		r.addFinding(fmt.Errorf("keepers %v and monitors %v still run a minute after the last pod went",
			berthdtest.ShimPids(n.d.State, "keeper"), berthdtest.ShimPids(n.d.State, "monitor")))
	}

	n.checkImageStore(ctx, r)
	// Every image removed: nothing of the store may remain.
	images, err := n.d.Image.ListImages(ctx, &criapi.ListImagesRequest{})
	if err != nil {
		t.Fatalf("ListImages: %v", err)
	}
	for _, img := range images.Images {
		if _, err := n.d.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: img.Id}}); err != nil {
			r.addFinding(fmt.Errorf("remove image %s: %w", img.Id, err))
		}
	}
	for _, d := range []string{"blobs/sha256", "layers", "records", "leases", "ingest", "trash"} {
		for _, f := range entriesBelow(filepath.Join(n.d.Root, "images", d)) {
			r.UnreferencedBlobs = append(r.UnreferencedBlobs, f+" (every image removed)")
		}
	}

	var leaks []string
	waitUntil(time.Minute, func() bool {
		leaks = n.leaks(t)
		return len(leaks) == 0
	})
	r.Leaks = leaks
}

// checkImageStore compares ImageFsInfo with du over the image store, and
// lists the blobs and ingest files no image references (the node's
// images as the registry has them: manifest, config, layers).
func (n *node) checkImageStore(ctx context.Context, r *report) {
	dir := filepath.Join(n.d.Root, "images")
	fs, err := n.d.Image.ImageFsInfo(ctx, &criapi.ImageFsInfoRequest{})
	if err != nil || len(fs.ImageFilesystems) == 0 {
		r.addFinding(fmt.Errorf("ImageFsInfo: %v", err))
		return
	}
	// ImageFsInfo keeps its walk up to a minute while nothing changes
	// through the store (image.usageMaxAge; container leases come and go
	// without a new walk): compared until they agree, up to 75 s.
	waitUntil(75*time.Second, func() bool {
		fs, err = n.d.Image.ImageFsInfo(ctx, &criapi.ImageFsInfoRequest{})
		if err != nil || len(fs.ImageFilesystems) == 0 {
			return false
		}
		r.ImageFsUsedBytes = fs.ImageFilesystems[0].GetUsedBytes().GetValue()
		out, err := exec.Command("du", "-s", "-B1", dir).Output()
		if err != nil {
			return false
		}
		if f := strings.Fields(string(out)); len(f) > 0 {
			r.DuBytes, _ = strconv.ParseUint(f[0], 10, 64)
		}
		return r.duMatches()
	})

	want := map[string]bool{}
	images, err := n.d.Image.ListImages(ctx, &criapi.ListImagesRequest{})
	if err != nil {
		r.addFinding(fmt.Errorf("ListImages: %v", err))
		return
	}
	for _, img := range images.Images {
		for _, tag := range img.RepoTags {
			pushed := n.pushed[tag]
			if pushed == nil {
				r.addFinding(fmt.Errorf("image %s (%s) is none the soak pushed", tag, img.Id))
				continue
			}
			if h, err := pushed.Digest(); err == nil {
				want[h.Hex] = true
			}
			if h, err := pushed.ConfigName(); err == nil {
				want[h.Hex] = true
			}
			ls, _ := pushed.Layers()
			for _, l := range ls {
				if h, err := l.Digest(); err == nil {
					want[h.Hex] = true
				}
			}
		}
	}
	for _, f := range entriesBelow(filepath.Join(dir, "blobs", "sha256")) {
		if !want[filepath.Base(f)] {
			r.UnreferencedBlobs = append(r.UnreferencedBlobs, f)
		}
	}
	r.UnreferencedBlobs = append(r.UnreferencedBlobs, entriesBelow(filepath.Join(dir, "ingest"))...)
}

// entriesBelow lists what dir holds (its whole tree, dir itself not).
func entriesBelow(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && p != dir {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// leaks lists what the node holds now that it did not before the first
// pod, in every scope, but for the QoS cgroups the kubelet keeps while
// it runs and the kubelet process itself.
func (n *node) leaks(t *testing.T) []string {
	seen := map[string]bool{}
	var out []string
	for i, s := range n.scopes {
		for _, l := range leakcheck.Diff(n.before[i], leakcheck.Take(t, s)) {
			qos := false
			for _, c := range n.k.QoSCgroups() {
				qos = qos || strings.HasSuffix(l, n.k.CgroupRoot+c)
			}
			self := n.k.Pid() != 0 && strings.HasPrefix(l, fmt.Sprintf("process: %d ", n.k.Pid()))
			// host-local's data dir and its network's dir (made by the
			// first ADD) stay, as its lock file does; its reservations
			// are the "ipam" category.
			ipamDir := strings.HasPrefix(l, "root-entry: "+s.IPAMDir) && !strings.HasPrefix(l, "root-entry: "+s.IPAMDir+"/berth/")
			if (strings.HasPrefix(l, "cgroup: ") && qos) || self || ipamDir || seen[l] {
				continue
			}
			seen[l] = true
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}
