// Package fault is berthd's fault-injection hook for recovery tests. An
// Injector names the points at which berthd exits abruptly, as a crash
// (or kill -9) there would, and the failure points at which an operation
// fails as a broken disk would make it. berthd builds one from
// BERTHD_TEST_FAULTS only when that variable is set; otherwise the stores
// hold a nil *Injector and every Hit or Fail is a nil test.
package fault

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
)

// EnvVar names the armed points, comma-separated.
const EnvVar = "BERTHD_TEST_FAULTS"

// ExitCode is what berthd exits with at an armed point, so a test can tell
// an injected crash from a real one.
const ExitCode = 86

// Point is one named place inside an RPC where berthd can be made to die.
type Point string

// The points. Each comment says what is half done when berthd dies there.
const (
	// SandboxAfterNetnsCreate: namespaces pinned, pod cgroup made, no CNI.
	SandboxAfterNetnsCreate Point = "after-netns-create"
	// SandboxAfterCNIAdd: veth, IP and port rules exist; record NOTREADY.
	SandboxAfterCNIAdd Point = "after-cni-add"
	// SandboxAfterCheckpointWrite: READY record (sandbox.json) written, RPC
	// not answered. Named before the sandbox's checkpoint.json became its
	// record (decision 2600); the name stays, tests and CI arm it.
	SandboxAfterCheckpointWrite Point = "after-checkpoint-write"
	// SandboxMidStop: CNI DEL done; namespaces still pinned, record
	// still READY with its attachment.
	SandboxMidStop Point = "mid-sandbox-stop"
	// SandboxMidRemove: CNI DEL and namespace teardown done, cgroup, files
	// and record still there.
	SandboxMidRemove Point = "mid-sandbox-remove"

	// ContainerAfterOverlayMount: dir and overlay mount, layers leased, no
	// record, nothing in the shim.
	ContainerAfterOverlayMount Point = "after-overlay-mount"
	// ContainerAfterImageVolumeMount: the container's image volumes are
	// mounted and their images leased (<id>.vol<n>) too; no record.
	ContainerAfterImageVolumeMount Point = "after-image-volume-mount"
	// ContainerAfterShimStart: the node's monitor serves the pod (keeper
	// and monitor launched for this create if none ran) but the pod holds
	// no container.
	ContainerAfterShimStart Point = "after-shim-start"
	// ContainerAfterRuncCreate: the shim created the container, no record.
	ContainerAfterRuncCreate Point = "after-runc-create"
	// ContainerAfterRecordWrite: record written, RPC not answered.
	ContainerAfterRecordWrite Point = "after-record-write"
	// ContainerBeforeRuncStart: StartContainer about to ask the shim.
	ContainerBeforeRuncStart Point = "before-runc-start"
	// ContainerAfterRuncStart: the process runs; the record still says
	// created.
	ContainerAfterRuncStart Point = "after-runc-start"
	// ContainerMidRemove: the shim deleted the container; rootfs still
	// mounted, layers leased, record on disk.
	ContainerMidRemove Point = "mid-container-remove"

	// ImageAfterBlobWrite: the manifest blob is stored, nothing else.
	ImageAfterBlobWrite Point = "after-blob-write"
	// ImageMidUnpack: the first layer is unpacked into layers/, no record.
	ImageMidUnpack Point = "mid-unpack"
	// ImageMidRemove: the image record is gone, its blobs and layers not.
	ImageMidRemove Point = "mid-image-remove"
	// ImageMidGC: a background collection pass removed unused blobs and
	// renamed unused layers into trash/, not yet deleted.
	ImageMidGC Point = "mid-image-gc"
)

// Points lists every crash point, in the order above.
var Points = []Point{
	SandboxAfterNetnsCreate, SandboxAfterCNIAdd, SandboxAfterCheckpointWrite, SandboxMidStop, SandboxMidRemove,
	ContainerAfterOverlayMount, ContainerAfterImageVolumeMount, ContainerAfterShimStart, ContainerAfterRuncCreate, ContainerAfterRecordWrite,
	ContainerBeforeRuncStart, ContainerAfterRuncStart, ContainerMidRemove,
	ImageAfterBlobWrite, ImageMidUnpack, ImageMidRemove, ImageMidGC,
}

// Failure points: armed, the operation fails there with ErrInjected and
// berthd goes on. Each comment says what fails.
const (
	// ContainerFailStartRecordWrite: StartContainer's write of the
	// "running" record, after the process started.
	ContainerFailStartRecordWrite Point = "fail-start-record-write"
	// ImageFailLeaseWrite: the write of an image lease file (Acquire, in
	// CreateContainer), after the lease is held in memory.
	ImageFailLeaseWrite Point = "fail-lease-write"
	// ImageFailLayerDigest: a pulled layer blob's digest check, after the
	// blob streamed into ingest/ and unpacked there, as if the registry
	// had sent other bytes.
	ImageFailLayerDigest Point = "fail-layer-digest"
	// HostFailSwapAccounting: the start-time probe of the host's swap
	// accounting finds none, as on a kernel booted with swapaccount=0 or
	// built without memory cgroup swap; berthd then runs as on such a
	// host (decision 3700).
	HostFailSwapAccounting Point = "fail-swap-accounting"
)

// FailPoints lists every failure point.
var FailPoints = []Point{ContainerFailStartRecordWrite, ImageFailLeaseWrite, ImageFailLayerDigest, HostFailSwapAccounting}

// ErrInjected is what an armed failure point fails with.
var ErrInjected = errors.New("injected test failure")

// Injector kills the process at its armed points. A nil *Injector is
// disarmed.
type Injector struct {
	armed map[Point]bool
	log   *slog.Logger
	exit  func(code int)
}

// New arms the given points; unknown names are an error, so a typo in a
// test does not silently test nothing.
func New(points []Point, log *slog.Logger) (*Injector, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	known := map[Point]bool{}
	all := append(append([]Point(nil), Points...), FailPoints...)
	for _, p := range all {
		known[p] = true
	}
	in := &Injector{armed: map[Point]bool{}, log: log, exit: os.Exit}
	for _, p := range points {
		if !known[p] {
			return nil, fmt.Errorf("unknown fault point %q (known: %s)", p, joinPoints(all))
		}
		in.armed[p] = true
	}
	return in, nil
}

// FromEnv builds an Injector from BERTHD_TEST_FAULTS; it returns nil
// (disarmed) when the variable is unset or empty.
func FromEnv(log *slog.Logger) (*Injector, error) {
	v := strings.TrimSpace(os.Getenv(EnvVar))
	if v == "" {
		return nil, nil
	}
	var points []Point
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			points = append(points, Point(f))
		}
	}
	in, err := New(points, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	in.log.Warn("test fault injection armed: berthd will exit at these points", "points", joinPoints(points))
	return in, nil
}

// Armed reports whether p is armed.
func (in *Injector) Armed(p Point) bool { return in != nil && in.armed[p] }

// Hit exits the process with ExitCode if p is armed. attrs (slog key/value
// pairs, such as the pod ID) go into the last log line.
func (in *Injector) Hit(p Point, attrs ...any) {
	if !in.Armed(p) || slices.Contains(FailPoints, p) {
		return
	}
	in.log.Warn("test fault: exiting abruptly", append([]any{"point", string(p)}, attrs...)...)
	in.exit(ExitCode)
}

// Fail returns ErrInjected, wrapped with the point's name, if failure
// point p is armed; nil otherwise.
func (in *Injector) Fail(p Point) error {
	if !in.Armed(p) || !slices.Contains(FailPoints, p) {
		return nil
	}
	in.log.Warn("test fault: failing", "point", string(p))
	return fmt.Errorf("%s: %w", p, ErrInjected)
}

func joinPoints(ps []Point) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}
