package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// errUnsupported marks a workload the endpoint cannot run (Unimplemented).
var errUnsupported = errors.New("unsupported by this runtime")

func unsupported(err error) error {
	if status.Code(err) == codes.Unimplemented {
		return fmt.Errorf("%w: %v", errUnsupported, err)
	}
	return err
}

// Workload is one measured scenario. Sample runs once per iteration and
// returns one duration per series it measures (several steps may be timed
// in one sample, e.g. run and stop+remove of a pod).
type Workload struct {
	Name     string
	Samples  int
	Setup    func(ctx context.Context, ep *Endpoint) (any, error)
	Sample   func(ctx context.Context, ep *Endpoint, state any, i int) (map[string]time.Duration, error)
	Teardown func(ctx context.Context, ep *Endpoint, state any)
	// Warmup is how many rounds run first, unrecorded; 0 means 3.
	Warmup int
	// Floor, when set, is measured in the same loop, after the endpoints.
	Floor *Floor
}

// counter makes pod and container names unique across a whole run.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}

var names counter

func podConfig(ep *Endpoint, prefix string) *criapi.PodSandboxConfig {
	n := names.next()
	name := fmt.Sprintf("%s-%d", prefix, n)
	return &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: fmt.Sprintf("uid-%s-%d", ep.Name, n)},
		Hostname:     name,
		LogDirectory: fmt.Sprintf("%s/logs/%s", ep.Dir, name),
		// What the kubelet sends without shareProcessNamespace: each
		// container its own PID namespace (the zero value means shared).
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

func containerConfig(image string, cmd ...string) *criapi.ContainerConfig {
	n := names.next()
	return &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: fmt.Sprintf("c%d", n)},
		Image:    &criapi.ImageSpec{Image: image},
		Command:  cmd,
		LogPath:  fmt.Sprintf("c%d.log", n),
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

// removePod stops and removes a pod, retrying once: a runtime that fails a
// teardown transiently (containerd 1.6 sometimes finds its netns busy)
// should not end the whole series.
func removePod(ctx context.Context, ep *Endpoint, id string) error {
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if attempt > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if _, err = ep.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			continue
		}
		if _, err = ep.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id}); err == nil {
			return nil
		}
	}
	return err
}

// podWithContainer runs a pod and a started `sleep` container in it.
func podWithContainer(ctx context.Context, ep *Endpoint, image string) (podID, ctrID string, err error) {
	pc := podConfig(ep, "pc")
	pod, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
	if err != nil {
		return "", "", unsupported(err)
	}
	c, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
		PodSandboxId: pod.PodSandboxId, Config: containerConfig(image, "sleep", "3600"), SandboxConfig: pc})
	if err != nil {
		removePod(ctx, ep, pod.PodSandboxId)
		return "", "", unsupported(err)
	}
	if _, err := ep.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		removePod(ctx, ep, pod.PodSandboxId)
		return "", "", unsupported(err)
	}
	return pod.PodSandboxId, c.ContainerId, nil
}

// Workloads returns the standard set, all through CRI only, each with its
// floor from floors (nil floors or fields: none).
func Workloads(image, multiLayerImage string, floors *Floors) []Workload {
	if floors == nil {
		floors = &Floors{}
	}
	return []Workload{
		podRunWorkload(floors.NetnsCNI),
		containerLifecycleWorkload(image, floors.RuncStart),
		parallelRemovalWorkload(image),
		{
			Name: "pod start end to end", Samples: 30, Floor: floors.PodStart,
			Sample: podStartSample(image, "RunPodSandbox+CreateContainer+StartContainer"),
		},
		podStartBesideWorkload(image, floors.PodStart),
		execWorkload(image, floors.RuncExec),
		listWorkload(image),
		pullWorkload(multiLayerImage, floors.TarExtract),
	}
}

// podRunWorkload times a pod's run, and its stop and removal.
func podRunWorkload(floor *Floor) Workload {
	return Workload{
		Name: "pod run / stop+remove", Samples: 30, Floor: floor,
		Sample: func(ctx context.Context, ep *Endpoint, _ any, i int) (map[string]time.Duration, error) {
			var id string
			run, err := timed(func() error {
				r, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: podConfig(ep, "p")})
				if err == nil {
					id = r.PodSandboxId
				}
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			down, err := timed(func() error { return removePod(ctx, ep, id) })
			if err != nil {
				return nil, unsupported(err)
			}
			return map[string]time.Duration{"RunPodSandbox": run, "StopPodSandbox+RemovePodSandbox": down}, nil
		},
	}
}

// containerLifecycleWorkload times a container's create, start, and stop
// and removal, in one pod kept for the series.
func containerLifecycleWorkload(image string, floor *Floor) Workload {
	return Workload{
		Name: "container create / start / stop+remove", Samples: 30, Floor: floor,
		Setup: func(ctx context.Context, ep *Endpoint) (any, error) {
			pc := podConfig(ep, "cl")
			r, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
			if err != nil {
				return nil, unsupported(err)
			}
			return &podState{id: r.PodSandboxId, cfg: pc}, nil
		},
		Sample: func(ctx context.Context, ep *Endpoint, st any, i int) (map[string]time.Duration, error) {
			pod := st.(*podState)
			var id string
			create, err := timed(func() error {
				r, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
					PodSandboxId: pod.id, Config: containerConfig(image, "sleep", "3600"), SandboxConfig: pod.cfg})
				if err == nil {
					id = r.ContainerId
				}
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			start, err := timed(func() error {
				_, err := ep.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: id})
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			down, err := timed(func() error {
				if _, err := ep.Runtime.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
					return err
				}
				_, err := ep.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id})
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			return map[string]time.Duration{"CreateContainer": create, "StartContainer": start,
				"CreateContainer+StartContainer": create + start, "StopContainer+RemoveContainer": down}, nil
		},
		Teardown: func(ctx context.Context, ep *Endpoint, st any) { removePod(ctx, ep, st.(*podState).id) },
	}
}

// parallelRemovalWorkload times creates while others are removed.
//
// The kubelet creates containers while others are being removed
// (rollouts, jobs). Before decision 1500 every removal collected image
// garbage under the image store's lock, which every create also takes.
// removalBacklog containers stay created for the whole series, as on a
// busy node: each collection read all their leases.
func parallelRemovalWorkload(image string) Workload {
	return Workload{
		Name: "container create under parallel removal", Samples: 30,
		Setup: func(ctx context.Context, ep *Endpoint) (any, error) {
			pc := podConfig(ep, "pr")
			r, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
			if err != nil {
				return nil, unsupported(err)
			}
			st := &podState{id: r.PodSandboxId, cfg: pc}
			for c := 0; c < removalBacklog; c++ {
				if _, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
					PodSandboxId: st.id, Config: containerConfig(image, "sleep", "3600"), SandboxConfig: pc}); err != nil {
					return st, unsupported(err)
				}
			}
			return st, nil
		},
		Sample: func(ctx context.Context, ep *Endpoint, st any, i int) (map[string]time.Duration, error) {
			return createUnderRemovalSample(ctx, ep, st.(*podState), image)
		},
		Teardown: func(ctx context.Context, ep *Endpoint, st any) {
			if st != nil {
				removePod(ctx, ep, st.(*podState).id)
			}
		},
	}
}

// createUnderRemovalSample creates parallelRemovals containers in pod,
// removes them all at once, and times the creates that follow each other
// while they are removed; the sample is their mean latency.
func createUnderRemovalSample(ctx context.Context, ep *Endpoint, pod *podState, image string) (map[string]time.Duration, error) {
	create := func() (string, error) {
		r, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
			PodSandboxId: pod.id, Config: containerConfig(image, "sleep", "3600"), SandboxConfig: pod.cfg})
		if err != nil {
			return "", unsupported(err)
		}
		return r.ContainerId, nil
	}
	remove := func(id string) error {
		_, err := ep.Runtime.RemoveContainer(ctx, &criapi.RemoveContainerRequest{ContainerId: id})
		return err
	}
	victims := make([]string, parallelRemovals)
	for v := range victims {
		id, err := create()
		if err != nil {
			return nil, err
		}
		victims[v] = id
	}
	// Creates follow each other for as long as the removals run.
	var wg sync.WaitGroup
	errs := make([]error, len(victims))
	removing := make(chan struct{})
	for v, id := range victims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[v] = remove(id)
		}()
	}
	go func() { wg.Wait(); close(removing) }()
	var created []string
	var total time.Duration
	var err error
	for done := false; !done && err == nil; {
		var id string
		var d time.Duration
		d, err = timed(func() error {
			var err error
			id, err = create()
			return err
		})
		if err == nil {
			created = append(created, id)
			total += d
		}
		select {
		case <-removing:
			done = true
		default:
		}
	}
	<-removing
	for _, id := range created {
		if rerr := remove(id); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	d := total / time.Duration(len(created))
	return map[string]time.Duration{fmt.Sprintf("CreateContainer (mean while %d are removed in parallel)", parallelRemovals): d}, nil
}

// podStartBesideWorkload is "pod start end to end" on a node that already
// runs a pod, as a kubelet's node does (its DaemonSets): berth's keeper
// and monitor, one pair per node (decision 1701), are then running, and
// the new pod is added to them rather than starting them.
func podStartBesideWorkload(image string, floor *Floor) Workload {
	return Workload{
		Name: "pod start beside a running pod", Samples: 30, Floor: floor,
		Setup: func(ctx context.Context, ep *Endpoint) (any, error) {
			podID, _, err := podWithContainer(ctx, ep, image)
			if err != nil {
				return nil, err
			}
			return &podState{id: podID}, nil
		},
		Sample: podStartSample(image, "RunPodSandbox+CreateContainer+StartContainer (another pod running)"),
		Teardown: func(ctx context.Context, ep *Endpoint, st any) {
			if st != nil {
				removePod(ctx, ep, st.(*podState).id)
			}
		},
	}
}

// execWorkload times ExecSync of true in a running container.
func execWorkload(image string, floor *Floor) Workload {
	return Workload{
		Name: "exec", Samples: 50, Floor: floor,
		Setup: func(ctx context.Context, ep *Endpoint) (any, error) {
			podID, ctrID, err := podWithContainer(ctx, ep, image)
			if err != nil {
				return nil, err
			}
			return &podState{id: podID, ctr: ctrID}, nil
		},
		Sample: func(ctx context.Context, ep *Endpoint, st any, i int) (map[string]time.Duration, error) {
			d, err := timed(func() error {
				r, err := ep.Runtime.ExecSync(ctx, &criapi.ExecSyncRequest{ContainerId: st.(*podState).ctr, Cmd: []string{"true"}, Timeout: 10})
				if err == nil && r.ExitCode != 0 {
					err = fmt.Errorf("exec true exited %d", r.ExitCode)
				}
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			return map[string]time.Duration{"ExecSync true": d}, nil
		},
		Teardown: func(ctx context.Context, ep *Endpoint, st any) { removePod(ctx, ep, st.(*podState).id) },
	}
}

// listWorkload times ListContainers with 500 containers created, 50 in
// each of 10 pods.
func listWorkload(image string) Workload {
	return Workload{
		Name: "list 500 containers", Samples: 30,
		Setup: func(ctx context.Context, ep *Endpoint) (any, error) {
			var pods []string
			for p := 0; p < 10; p++ {
				pc := podConfig(ep, "lc")
				r, err := ep.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: pc})
				if err != nil {
					return &podList{ids: pods}, unsupported(err)
				}
				pods = append(pods, r.PodSandboxId)
				for c := 0; c < 50; c++ {
					if _, err := ep.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{
						PodSandboxId: r.PodSandboxId, Config: containerConfig(image, "sleep", "3600"), SandboxConfig: pc}); err != nil {
						return &podList{ids: pods}, unsupported(err)
					}
				}
			}
			return &podList{ids: pods}, nil
		},
		Sample: func(ctx context.Context, ep *Endpoint, _ any, i int) (map[string]time.Duration, error) {
			d, err := timed(func() error {
				r, err := ep.Runtime.ListContainers(ctx, &criapi.ListContainersRequest{})
				if err == nil && len(r.Containers) < 500 {
					err = fmt.Errorf("listed %d containers, want ≥500", len(r.Containers))
				}
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			return map[string]time.Duration{"ListContainers (500)": d}, nil
		},
		Teardown: func(ctx context.Context, ep *Endpoint, st any) {
			if st == nil {
				return
			}
			for _, id := range st.(*podList).ids {
				removePod(ctx, ep, id)
			}
		},
	}
}

// pullWorkload times a pull of the multi-layer image from the local
// registry, removing it after each (untimed).
func pullWorkload(multiLayerImage string, floor *Floor) Workload {
	return Workload{
		Name: "image pull", Samples: 10, Floor: floor,
		Sample: func(ctx context.Context, ep *Endpoint, _ any, i int) (map[string]time.Duration, error) {
			d, err := timed(func() error {
				_, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: multiLayerImage}})
				return err
			})
			if err != nil {
				return nil, unsupported(err)
			}
			if _, err := ep.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: multiLayerImage}}); err != nil {
				return nil, unsupported(err)
			}
			return map[string]time.Duration{"PullImage (4 layers, local registry)": d}, nil
		},
	}
}

// RealPullWorkload pulls ri (pushed as ref) on every endpoint, the image
// removed before each pull (untimed), so every sample downloads, verifies
// and unpacks all of it; its floor decompresses and writes the same layers
// in-process. Few samples: each moves hundreds of MB.
func RealPullWorkload(ri *RealImage, ref string) Workload {
	series := fmt.Sprintf("PullImage real size %s (%d layers, %d MB blobs, %d MB unpacked)",
		ri.Compression, len(ri.Layers), ri.Compressed>>20, ri.Unpacked>>20)
	return Workload{
		Name: "image pull real size " + ri.Compression, Samples: 5, Warmup: 1,
		Floor: unpackFloor(ri, series),
		Sample: func(ctx context.Context, ep *Endpoint, _ any, i int) (map[string]time.Duration, error) {
			d, err := freshPull(ctx, ep, ref)
			if err != nil {
				return nil, err
			}
			return map[string]time.Duration{series: d}, nil
		},
		Teardown: func(ctx context.Context, ep *Endpoint, _ any) { removeImage(ctx, ep, ref) },
	}
}

// removeImage removes ref from ep's store.
func removeImage(ctx context.Context, ep *Endpoint, ref string) error {
	_, err := ep.Image.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	return err
}

// freshPull times a pull of ref on ep after removing it (untimed), so
// that the pull downloads, verifies and unpacks all of it. Errors are
// unsupported(err): the endpoint's series is left out.
func freshPull(ctx context.Context, ep *Endpoint, ref string) (time.Duration, error) {
	if err := removeImage(ctx, ep, ref); err != nil {
		return 0, unsupported(err)
	}
	// Each sample starts with nothing dirty in the page cache: the
	// previous endpoint's writes are not this one's to flush.
	syscall.Sync()
	settleFreedInodes()
	d, err := timed(func() error {
		_, err := ep.Image.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
		return err
	})
	if err != nil {
		return 0, unsupported(err)
	}
	return d, nil
}

// freedInodeWindow is how long ext4 without a journal keeps skipping an
// inode after it was freed while its inode-table block is clean
// (RECENTCY_MIN, 5 s), plus a second for its one-second clock.
const freedInodeWindow = 6 * time.Second

// settleFreedInodes waits out freedInodeWindow before a real-size pull
// sample. Every sample follows a removal (its own, and the endpoint's or
// floor's before it), and on ext4 without a journal, as this development
// machine's, a pull that starts within 5 s of one scans past each freed
// inode with a buffer-cache lookup, 1–10 s more depending on where the
// layers land (decision 1512). That measures how soon after a removal the
// pull came, not the pull; a node's image GC and its next pull are rarely
// seconds apart, and journaled ext4 or xfs never skip. Preceded by a sync,
// so that no inode-table block is dirty (which would make the window
// 305 s).
func settleFreedInodes() { time.Sleep(freedInodeWindow) }

// The parallel-removal series: containers removed while one is created,
// and containers that stay created throughout.
const (
	parallelRemovals = 8
	removalBacklog   = 100
)

// podStartSample times one pod's start end to end (RunPodSandbox,
// CreateContainer, StartContainer), reported as series, then removes it
// (untimed).
func podStartSample(image, series string) func(context.Context, *Endpoint, any, int) (map[string]time.Duration, error) {
	return func(ctx context.Context, ep *Endpoint, _ any, _ int) (map[string]time.Duration, error) {
		var podID string
		d, err := timed(func() error {
			var err error
			podID, _, err = podWithContainer(ctx, ep, image)
			return err
		})
		if err != nil {
			return nil, err
		}
		if err := removePod(ctx, ep, podID); err != nil {
			return nil, err
		}
		return map[string]time.Duration{series: d}, nil
	}
}

type podState struct {
	id, ctr string
	cfg     *criapi.PodSandboxConfig
}

type podList struct{ ids []string }

// ScaleResult is the outcome of the parallel pods scenario.
type ScaleResult struct {
	Pods         int     `json:"pods"`
	Parallel     int     `json:"parallel"`
	UpPodsPerSec float64 `json:"up_pods_per_sec"`
	DownPerSec   float64 `json:"down_pods_per_sec"`
	PSSKiB       uint64  `json:"runtime_pss_kib"`
	Processes    int     `json:"runtime_processes"`
}

// Scale starts pods (each with one container) at the given parallelism,
// measures the runtime's memory with them running, then tears them down.
func Scale(ctx context.Context, ep *Endpoint, image string, pods, parallel int) (ScaleResult, error) {
	res := ScaleResult{Pods: pods, Parallel: parallel}
	ids := make([]string, pods)
	run := func(f func(i int) error) (time.Duration, error) {
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		errs := make([]error, pods)
		start := time.Now()
		for i := 0; i < pods; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				errs[i] = f(i)
			}(i)
		}
		wg.Wait()
		return time.Since(start), errors.Join(errs...)
	}
	up, err := run(func(i int) error {
		var err error
		ids[i], _, err = podWithContainer(ctx, ep, image)
		return err
	})
	if err != nil {
		for _, id := range ids {
			if id != "" {
				removePod(ctx, ep, id)
			}
		}
		return res, err
	}
	res.UpPodsPerSec = float64(pods) / up.Seconds()
	pids := ep.Pids()
	res.Processes = len(pids)
	res.PSSKiB = PSSKiB(pids)
	down, err := run(func(i int) error { return removePod(ctx, ep, ids[i]) })
	if err != nil {
		return res, err
	}
	res.DownPerSec = float64(pods) / down.Seconds()
	return res, nil
}
