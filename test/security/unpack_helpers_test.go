package security

// Helpers of the hostile-image tests (issue 34 findings 3, 4, 5, 7 and
// the device-node decision): layers written by hand, images served by the
// in-process registry, a pod that runs one and berthd's CPU time.

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// unpackTar writes headers (and data for regular files) as a tar.
func unpackTar(t *testing.T, hdrs []*tar.Header, data map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1600000000, 0)
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(data[h.Name]))
		}
		if h.Mode == 0 {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(data[h.Name])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// unpackLayerOf is an uncompressed tar as an OCI layer.
func unpackLayerOf(t *testing.T, tarBytes []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// unpackRawLayer is a layer blob given as is (compressed by the test),
// with the diff ID of its uncompressed stream.
type unpackRawLayer struct {
	blob   []byte
	diffID v1.Hash
	mt     types.MediaType
}

func (l *unpackRawLayer) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(l.blob))
	return h, err
}
func (l *unpackRawLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }
func (l *unpackRawLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}
func (l *unpackRawLayer) Uncompressed() (io.ReadCloser, error) { return nil, fmt.Errorf("not needed") }
func (l *unpackRawLayer) Size() (int64, error)                 { return int64(len(l.blob)), nil }
func (l *unpackRawLayer) MediaType() (types.MediaType, error)  { return l.mt, nil }

// unpackDiffID is the sha256 of an uncompressed stream.
func unpackDiffID(t *testing.T, r io.Reader) v1.Hash {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
}

// unpackImage is the busybox test image with layers on top, running cmd.
func unpackImage(t *testing.T, cmd []string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := testimages.Build(nil, v1.Config{Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layers...); err != nil {
		t.Fatal(err)
	}
	return img
}

// unpackPull pulls ref through the CRI.
func unpackPull(t *testing.T, d *berthdtest.Daemon, ref string) error {
	t.Helper()
	_, err := d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	return err
}

// unpackCPUTicks is a process's user and system time in clock ticks
// (USER_HZ, 100 a second on Linux).
func unpackCPUTicks(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name (which may hold spaces).
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime
}

// unpackIngestEmpty waits until the image store's ingest dir is empty
// (what a failed pull wrote is removed) and fails the test if it stays not.
func unpackIngestEmpty(t *testing.T, d *berthdtest.Daemon) {
	t.Helper()
	dir := filepath.Join(d.Root, "images", "ingest")
	var es []os.DirEntry
	for i := 0; i < 100; i++ {
		es, _ = os.ReadDir(dir)
		if len(es) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the failed pull left %d entries in %s (%s …)", len(es), dir, es[0].Name())
}

// unpackRunOutput runs image ref's command in a fresh pod and returns its
// stdout and stderr lines.
func unpackRunOutput(t *testing.T, d *berthdtest.Daemon, ref string) []string {
	t.Helper()
	ctx := berthdtest.Ctx(t)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	logDir := filepath.Join(d.Dir, "podlogs-"+name)
	podCfg := &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: name + "-uid"},
		Hostname:     "unpack",
		LogDirectory: logDir,
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
	pod, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: podCfg})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	cfg := &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: "main"},
		Image:    &criapi.ImageSpec{Image: ref},
		LogPath:  "main.log",
		Linux: &criapi.LinuxContainerConfig{SecurityContext: &criapi.LinuxContainerSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
		}},
	}
	ctr, err := d.Runtime.CreateContainer(ctx, &criapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		t.Fatalf("CreateContainer: %v", err)
	}
	if _, err := d.Runtime.StartContainer(ctx, &criapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v", err)
	}
	for {
		st, err := d.Runtime.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: ctr.ContainerId})
		if err != nil {
			t.Fatalf("ContainerStatus: %v", err)
		}
		if st.Status.State == criapi.ContainerState_CONTAINER_EXITED {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("container still %s", st.Status.State)
		}
		time.Sleep(50 * time.Millisecond)
	}
	data, err := os.ReadFile(filepath.Join(logDir, "main.log"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		// CRI log lines: time stream tag message.
		if f := strings.SplitN(l, " ", 4); len(f) == 4 {
			lines = append(lines, f[3])
		}
	}
	return lines
}
