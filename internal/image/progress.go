package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

// errStalled is the cause a pull is cancelled with when nothing arrived
// from the registry for the progress timeout.
var errStalled = errors.New("pull made no progress")

// layerBytes counts the bytes each layer stream (by chain ID) has read so
// far. Every pull waiting on a layer, the one whose download it is and any
// that joined it, sees the same count.
type layerBytes struct {
	mu     sync.Mutex // guards counts (the map; each counter is atomic)
	counts map[string]*atomic.Int64
}

// start returns the counter of key's stream and a func that drops it.
func (b *layerBytes) start(key string) (*atomic.Int64, func()) {
	c := &atomic.Int64{}
	b.mu.Lock()
	if b.counts == nil {
		b.counts = map[string]*atomic.Int64{}
	}
	b.counts[key] = c
	b.mu.Unlock()
	return c, func() {
		b.mu.Lock()
		if b.counts[key] == c {
			delete(b.counts, key)
		}
		b.mu.Unlock()
	}
}

// sum adds up the counters of keys that are streaming now.
func (b *layerBytes) sum(keys []string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for _, k := range keys {
		if c := b.counts[k]; c != nil {
			n += c.Load()
		}
	}
	return n
}

// pullWatch is one pull's progress: its own steps (manifest, config) and
// the layers it waits for. A pull whose progress has not moved for the
// timeout is cancelled with errStalled: containerd's
// image_pull_progress_timeout, CRI-O's pull_progress_timeout. The kubelet
// sets no deadline on PullImage, and with serialized pulls (its default) a
// hung pull would block every pull on the node.
type pullWatch struct {
	board   *layerBytes
	steps   atomic.Int64
	mu      sync.Mutex // guards layers
	layers  []string
	timeout time.Duration
}

// step records progress of the pull's own requests.
func (w *pullWatch) step() {
	if w != nil {
		w.steps.Add(1)
	}
}

// waitFor names the layers (chain IDs) whose streams count as progress.
func (w *pullWatch) waitFor(chainIDs []string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.layers = append([]string(nil), chainIDs...)
	w.mu.Unlock()
	w.step()
}

func (w *pullWatch) progress() int64 {
	w.mu.Lock()
	layers := w.layers
	w.mu.Unlock()
	return w.steps.Load() + w.board.sum(layers)
}

// watch returns ctx cancelled with errStalled once the pull's progress
// stands still for timeout (0: never), and a func that ends the watch.
func (s *Store) watch(ctx context.Context, timeout time.Duration) (context.Context, *pullWatch, func()) {
	w := &pullWatch{board: &s.streams, timeout: timeout}
	if w.timeout <= 0 {
		return ctx, w, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	tick := w.timeout / 8
	if tick < 10*time.Millisecond {
		tick = 10 * time.Millisecond
	}
	if tick > time.Second {
		tick = time.Second
	}
	go func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		last, since := w.progress(), time.Now()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				if p := w.progress(); p != last {
					last, since = p, now
				} else if now.Sub(since) >= w.timeout {
					cancel(errStalled)
					return
				}
			}
		}
	}()
	var once sync.Once
	return ctx, w, func() {
		once.Do(func() {
			close(stop)
			cancel(nil)
		})
	}
}

// stalledError turns the failure of a pull its watch cancelled into a
// DeadlineExceeded error naming the timeout; other errors pass.
func (w *pullWatch) stalledError(ctx context.Context, ref string, err error) error {
	if err == nil || !errors.Is(context.Cause(ctx), errStalled) {
		return err
	}
	return fmt.Errorf("pull %s: nothing received from the registry for %s (image_pull_progress_timeout): %w", ref, w.timeout, errdefs.ErrDeadlineExceeded)
}

// progressReader counts what it reads into n and stops at ctx's end.
type progressReader struct {
	ctx context.Context
	r   io.Reader
	n   *atomic.Int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := p.r.Read(b)
	p.n.Add(int64(n))
	return n, err
}
