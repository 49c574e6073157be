package stats

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

// copyTree copies the fixture so a test can advance its counters.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

const fixturePod = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice"

// The collector on a v2 tree: a container named by its systemd
// cgroupsPath (as it appears in an OCI spec), its writable layer, and a
// nano-core rate from two samples; the pod by its own cgroup.
func TestCollectorV2ContainerAndPodFromFixture(t *testing.T) {
	root := copyTree(t, "testdata/cgroupv2")
	// The test process stands in for the container's: its threads and
	// open files are counted through cgroup.procs.
	procs := filepath.Join(root, fixturePod, "cri-berth-ctr1.scope", "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := NewCollector(CollectorOptions{V2Root: root})
	upper := t.TempDir()
	if err := os.WriteFile(filepath.Join(upper, "written"), make([]byte, 32*1024), 0o644); err != nil {
		t.Fatal(err)
	}

	s1, err := c.Container("ctr1", "kubepods-besteffort-pod1234.slice:cri-berth:ctr1", upper)
	if err != nil {
		t.Fatal(err)
	}
	if s1.CPUUsageNanos != 2500000*1000 || s1.NanoCores != 0 {
		t.Fatalf("first sample: cpu %d rate %d", s1.CPUUsageNanos, s1.NanoCores)
	}
	if s1.WorkingSet != 78643200-8388608 || s1.RSS != 67108864 || s1.MemoryLimit != 134217728 || s1.Processes != 3 {
		t.Fatalf("memory %+v", *s1.Usage)
	}
	if s1.WritableBytes < 32*1024 || s1.WritableInodes != 2 || s1.WritableAt.IsZero() {
		t.Fatalf("writable layer %d bytes %d inodes", s1.WritableBytes, s1.WritableInodes)
	}
	if s1.Threads < 1 || s1.FileDescriptors < 3 || s1.CFSThrottledPeriods != 7 || s1.OOMKills != 1 {
		t.Fatalf("detail %+v", *s1.Usage)
	}
	if s1.Fs.LimitBytes < s1.WritableBytes || s1.Fs.Inodes == 0 || s1.Fs.InodesFree > s1.Fs.Inodes {
		t.Fatalf("writable layer filesystem %+v", s1.Fs)
	}

	// Half a second of CPU later: a rate between the samples.
	time.Sleep(50 * time.Millisecond)
	stat := filepath.Join(root, fixturePod, "cri-berth-ctr1.scope", "cpu.stat")
	data, _ := os.ReadFile(stat)
	if err := os.WriteFile(stat, []byte(strings.Replace(string(data), "usage_usec 2500000", "usage_usec 3000000", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	s2, err := c.Container("ctr1", "kubepods-besteffort-pod1234.slice:cri-berth:ctr1", upper)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := s2.Timestamp.Sub(s1.Timestamp)
	want := uint64(float64(500000*1000) / float64(elapsed.Nanoseconds()) * 1e9)
	if s2.NanoCores == 0 || s2.NanoCores > want+want/100 || s2.NanoCores+want/100 < want {
		t.Fatalf("rate %d, want about %d over %s", s2.NanoCores, want, elapsed)
	}
	// Forgotten on remove: a new object of the same ID starts over.
	c.Forget("ctr1")
	if s3, err := c.Container("ctr1", "kubepods-besteffort-pod1234.slice:cri-berth:ctr1", ""); err != nil || s3.NanoCores != 0 || s3.WritableAt != (time.Time{}) {
		t.Fatalf("after Forget: %+v, %v", s3, err)
	}

	pod, err := c.Pod("pod1234", fixturePod, "")
	if err != nil {
		t.Fatal(err)
	}
	if pod.Processes != 4 || pod.MemoryLimit != 0 || pod.Interfaces != nil || pod.MemoryUsage == 0 {
		t.Fatalf("pod %+v interfaces %v", *pod.Usage, pod.Interfaces)
	}

	if _, err := c.Container("gone", "kubepods-besteffort-pod1234.slice:cri-berth:gone", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing container cgroup: %v, want NotFound", err)
	}
	if _, err := c.Pod("bad", "relative", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("relative pod cgroup: %v, want InvalidArgument", err)
	}
}
