package image

import (
	"context"
	"time"
)

// A lazy layer's background fetch waits for its node's lazy reads to
// stop (decision 3600, "The background fetch yields"). Fetching,
// decompressing and checking a multi-GB blob at full speed takes the CPU
// that the container starting on the image needs to have its first
// chunks fetched, decompressed and checked: on the 2-vCPU bench machine a
// container read its first 64 MiB of weights in 4.5 s beside its
// image's background fetch and in 1.5 s without it. So the fetch starts
// once no lazy layer of the node has been read from a registry for the
// quiet period (image_lazy_pull.background_fetch_quiet; the wait counts
// from when the fetch could start, the end of the pull), and
// backgroundQuietMax after that at the latest, so that a container that
// reads on and on does not keep its image from ever arriving. A fetch
// under way does not stop for reads that begin after it.

// backgroundQuietMax bounds the wait for quiet.
const backgroundQuietMax = 30 * time.Second

// touch records a read of a lazy layer from its registry, now.
func (z *lazyLayers) touch() { z.lastRead.Store(time.Now().UnixNano()) }

// waitQuiet returns true once no lazy layer has been read for quiet, or
// limit after it began, and false if ctx ends first. It counts as a read
// itself: the pull that just ended read the layer's TOC and prefetch.
func (z *lazyLayers) waitQuiet(ctx context.Context, quiet, limit time.Duration) bool {
	if quiet <= 0 {
		return ctx.Err() == nil
	}
	z.touch()
	deadline := time.Now().Add(limit)
	for {
		now := time.Now()
		idle := now.Sub(time.Unix(0, z.lastRead.Load()))
		if idle >= quiet || !now.Before(deadline) {
			return ctx.Err() == nil
		}
		t := time.NewTimer(min(quiet-idle, deadline.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}
