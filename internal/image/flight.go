package image

import (
	"context"
	"sync"
)

// flight runs one function per key at a time and hands its result to every
// caller that asked meanwhile (20 concurrent pulls of one image share one
// download). Unlike x/sync/singleflight, a caller whose context ends stops
// waiting at once, and the shared work is cancelled only when no caller is
// left.
type flight[T any] struct {
	mu    sync.Mutex // guards calls and each call's waiters
	calls map[string]*flightCall[T]
}

type flightCall[T any] struct {
	done    chan struct{}
	val     T
	err     error
	waiters int
	cancel  context.CancelFunc
}

func (f *flight[T]) Do(ctx context.Context, key string, fn func(context.Context) (T, error)) (T, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]*flightCall[T]{}
	}
	c, ok := f.calls[key]
	if !ok {
		// The work outlives the first caller's deadline; each caller's own
		// context bounds only its wait.
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &flightCall[T]{done: make(chan struct{}), cancel: cancel}
		f.calls[key] = c
		go func() {
			v, err := fn(cctx)
			f.mu.Lock()
			c.val, c.err = v, err
			if f.calls[key] == c {
				delete(f.calls, key)
			}
			f.mu.Unlock()
			cancel()
			close(c.done)
		}()
	}
	c.waiters++
	f.mu.Unlock()

	select {
	case <-c.done:
		return c.val, c.err
	case <-ctx.Done():
		f.mu.Lock()
		c.waiters--
		if c.waiters == 0 {
			c.cancel()
			if f.calls[key] == c {
				delete(f.calls, key)
			}
		}
		f.mu.Unlock()
		var zero T
		return zero, ctx.Err()
	}
}
