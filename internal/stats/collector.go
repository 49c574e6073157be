package stats

import (
	"fmt"
	"time"

	"github.com/containerd/cgroups/v3"
)

// Collector samples containers and pods for the CRI stats RPCs: cgroup
// usage, CPU rates between samples (kept per object until Forget) and
// writable-layer and network usage.
type Collector struct {
	read func(group string) (*Usage, error)
	rate *CPURate
}

// CollectorOptions choose where cgroups are read.
type CollectorOptions struct {
	// V2Root, when set, reads every cgroup as v2 below this directory
	// (tests point it at a fixture tree). Empty: the host's hierarchy,
	// whichever version it runs.
	V2Root string
}

// NewCollector returns a collector over the host's cgroups (or opts.V2Root).
func NewCollector(opts CollectorOptions) *Collector {
	c := &Collector{rate: NewCPURate()}
	switch {
	case opts.V2Root != "":
		c.read = func(g string) (*Usage, error) { return ReadV2(opts.V2Root, g) }
	case cgroups.Mode() == cgroups.Unified:
		c.read = func(g string) (*Usage, error) { return ReadV2("/sys/fs/cgroup", g) }
	default:
		c.read = ReadV1
	}
	return c
}

// Sample is one object's usage with its CPU rate.
type Sample struct {
	*Usage
	// NanoCores is the CPU rate since this object's previous sample (0 on
	// the first).
	NanoCores uint64
}

// ContainerSample is a container's usage and writable layer.
type ContainerSample struct {
	Sample
	WritableBytes, WritableInodes uint64
	WritableAt                    time.Time
	// Fs is the filesystem holding the writable layer (zero without one).
	Fs FsCapacity
}

// PodSample is a pod's cgroup usage and network counters.
type PodSample struct {
	Sample
	// Interfaces is nil for a pod on the host network.
	Interfaces []Interface
	NetworkAt  time.Time
}

func (c *Collector) sample(id, cgroupsPath string) (Sample, error) {
	group, err := GroupPath(cgroupsPath)
	if err != nil {
		return Sample{}, err
	}
	u, err := c.read(group)
	if err != nil {
		return Sample{}, err
	}
	return Sample{Usage: u, NanoCores: c.rate.NanoCores(id, u.Timestamp, u.CPUUsageNanos)}, nil
}

// Container samples a container whose OCI cgroupsPath is cgroupsPath and
// whose writable layer is upperDir. A container whose cgroup is gone
// (exited, not yet removed) is ErrNotFound from the cgroup read.
func (c *Collector) Container(id, cgroupsPath, upperDir string) (*ContainerSample, error) {
	s, err := c.sample(id, cgroupsPath)
	if err != nil {
		return nil, err
	}
	out := &ContainerSample{Sample: s}
	if upperDir != "" {
		b, n, err := DirUsage(upperDir)
		if err != nil {
			return nil, fmt.Errorf("writable layer of %s: %w", id, err)
		}
		out.WritableBytes, out.WritableInodes, out.WritableAt = b, n, time.Now()
		if out.Fs, err = Capacity(upperDir); err != nil {
			return nil, fmt.Errorf("writable layer of %s: %w", id, err)
		}
	}
	return out, nil
}

// Pod samples a pod whose own cgroup is cgroupPath (it holds every
// container of the pod) and whose network namespace is pinned at
// netnsPath ("" on the host network: no network stats).
func (c *Collector) Pod(id, cgroupPath, netnsPath string) (*PodSample, error) {
	s, err := c.sample(id, cgroupPath)
	if err != nil {
		return nil, err
	}
	out := &PodSample{Sample: s}
	if netnsPath != "" {
		ifs, err := Network(netnsPath)
		if err != nil {
			return nil, fmt.Errorf("network of pod %s: %w", id, err)
		}
		out.Interfaces, out.NetworkAt = ifs, time.Now()
	}
	return out, nil
}

// Forget drops an object's CPU history when it is removed.
func (c *Collector) Forget(id string) { c.rate.Forget(id) }
