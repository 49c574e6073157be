package image

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/diskusage"
)

// Usage is what the store occupies on disk.
type Usage struct {
	Bytes  uint64
	Inodes uint64
}

// usageMaxAge bounds how stale a cached Usage may be when nothing changed
// through the store (kubelet asks every few seconds; walks cost O(files)).
const usageMaxAge = time.Minute

// usageCache keeps the last walk of the store until the store changes
// (changed: a record written or removed, content collected) or
// usageMaxAge passes.
type usageCache struct {
	dir   string // the store root
	trash string // skipped: being deleted
	// skip, if set, names more directories the walk does not enter
	// (lazy layers' mounts: their files are not on disk).
	skip func(dir string) bool
	gen  atomic.Uint64

	// mu guards the cached walk below (and serializes walks).
	mu       sync.Mutex
	usage    Usage
	usageGen uint64
	valid    bool
	at       time.Time
}

// changed invalidates the cached walk.
func (c *usageCache) changed() { c.gen.Add(1) }

func (c *usageCache) get() (Usage, error) {
	gen := c.gen.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.valid && c.usageGen == gen && time.Since(c.at) < usageMaxAge {
		return c.usage, nil
	}
	u, err := diskusage.Walk(c.dir, func(p string) bool { return p == c.trash || (c.skip != nil && c.skip(p)) })
	if err != nil {
		return Usage(u), fmt.Errorf("measure image store %s: %w", c.dir, err)
	}
	c.usage, c.usageGen, c.at, c.valid = Usage(u), gen, time.Now(), true
	return Usage(u), nil
}

// Usage sums allocated bytes and inodes of the store (hard links counted
// once). The walk is cached until the store changes or usageMaxAge passes.
func (s *Store) Usage() (Usage, error) { return s.usage.get() }
