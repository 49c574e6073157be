package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/berthcri/berth/internal/image"
)

// BigShape is the remote registry the big image is pulled from: 100 MB/s
// per connection, 20 ms per request (issue 26's example).
var BigShape = Shape{BytesPerSec: 100_000_000, Latency: 20 * time.Millisecond}

// bigSeries names the big image's pull series, with the registry's shape.
func bigSeries(bi *BigImage, shape Shape) string {
	return fmt.Sprintf("PullImage big %s (%d layers, %d MB blobs, %d MB unpacked; registry %s)",
		bi.Compression, len(bi.Layers), bi.Compressed()>>20, bi.Unpacked()>>20, shape)
}

// BigPullWorkload pulls the big image ref from a shaped registry, each
// sample on an empty store and a settled disk; the image is removed after
// each sample, untimed, so that the endpoints' copies never add up on the
// disk.
func BigPullWorkload(bi *BigImage, reg *ShapedRegistry, ref string) Workload {
	series := bigSeries(bi, reg.Shape)
	return Workload{
		Name: "big image pull " + bi.Compression, Samples: 3, Warmup: 1,
		Floor: bigFloor(bi, reg, series),
		Sample: func(ctx context.Context, ep *Endpoint, _ any, i int) (map[string]time.Duration, error) {
			d, err := freshPull(ctx, ep, ref)
			if err != nil {
				return nil, err
			}
			if err := removeImage(ctx, ep, ref); err != nil {
				return nil, unsupported(err)
			}
			return map[string]time.Duration{series: d}, nil
		},
		Teardown: func(ctx context.Context, ep *Endpoint, _ any) { removeImage(ctx, ep, ref) },
	}
}

// bigFloor is the least a pull of bi from reg can cost here: every blob
// moved from the shaped registry with the connections berth opens
// (layers three at a time, a large one in image.DefaultRangeFetch's
// parallel ranges) into nothing, plus each layer decompressed from its
// file in-process and its entries written as plain files (writeLayer),
// three at a time. The two are measured one after the other and added:
// a pull that overlaps them can come in under this floor.
func bigFloor(bi *BigImage, reg *ShapedRegistry, bounds string) *Floor {
	var ft floorTrees
	set := image.DefaultRangeFetch
	return &Floor{
		Name:   fmt.Sprintf("download at %d ranges × 3 layers + in-process %s -d + write", set.Parallel, bi.Compression),
		Bounds: bounds,
		Setup: func(ctx context.Context) (any, error) {
			return nil, ft.setup("berth-bench-big-floor-")
		},
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			dir, err := ft.next(i)
			if err != nil {
				return 0, err
			}
			syscall.Sync()
			settleFreedInodes()
			start := time.Now()
			if err := bigDownload(ctx, bi, reg, set); err != nil {
				return 0, err
			}
			err = writeLayers(dir, len(bi.Layers), func(j int, ld string) error {
				f, err := os.Open(bi.Layers[j].Path)
				if err != nil {
					return err
				}
				defer f.Close()
				return writeLayerFrom(f, ld)
			})
			took := time.Since(start)
			// Untimed: the floor's tree goes before the next endpoint.
			os.RemoveAll(dir)
			return took, err
		},
		Teardown: func(ctx context.Context, _ any) { os.RemoveAll(ft.work) },
	}
}

// getDiscard GETs url (bytes [start, end) when end > 0) with client and
// reads the body into nothing; name is what an error calls it.
func getDiscard(ctx context.Context, client *http.Client, url, name string, start, end int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if end > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end-1))
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		return fmt.Errorf("GET %s: %s", name, resp.Status)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// bigDownload moves every blob of bi from reg into nothing.
func bigDownload(ctx context.Context, bi *BigImage, reg *ShapedRegistry, set image.RangeFetch) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	get := func(digest string, start, end int64) error {
		return getDiscard(ctx, client, "http://"+reg.Host+"/v2/big/blobs/"+digest, digest, start, end)
	}
	var g errgroup.Group
	g.SetLimit(3)
	for _, l := range bi.Layers {
		g.Go(func() error {
			if l.Size < set.MinSize {
				return get(l.Digest, 0, 0)
			}
			var rg errgroup.Group
			rg.SetLimit(set.Parallel)
			for off := int64(0); off < l.Size; off += set.ChunkSize {
				rg.Go(func() error { return get(l.Digest, off, min(off+set.ChunkSize, l.Size)) })
			}
			return rg.Wait()
		})
	}
	return g.Wait()
}
