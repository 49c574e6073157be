package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// Deferred writes files as Write does (temp file, rename: never torn for
// a reader or a restarted process) but returns before they are durable:
// the fsyncs of the file and its directory run right after, on a
// goroutine of their own, off the caller's path (decision 1600). Until
// they are done a power loss or kernel crash may leave the previous
// file, no file, or, for a file that did not exist before, an empty one;
// a process crash (berthd killed) loses nothing, the page cache has it.
// Use it only for files whose recovery accepts that (docs/reliability.md
// says which).
//
// Make one with NewDeferred; a nil *Deferred writes synchronously, as
// Write.
type Deferred struct {
	// OnError hears of a background fsync that failed (the disk is in
	// trouble); nil ignores them. It runs on the flushing goroutine.
	OnError func(path string, err error)

	mu      sync.Mutex
	pending map[string]struct{} // files written and not yet fsynced
	running bool                // a flush goroutine runs
	idle    *sync.Cond          // signalled when it stops
}

// NewDeferred returns a Deferred that reports failed fsyncs to onError.
func NewDeferred(onError func(path string, err error)) *Deferred {
	d := &Deferred{OnError: onError, pending: map[string]struct{}{}}
	d.idle = sync.NewCond(&d.mu)
	return d
}

// Write replaces path with data atomically and schedules its fsync.
func (d *Deferred) Write(path string, data []byte, perm os.FileMode) error {
	if d == nil {
		return Write(path, data, perm)
	}
	if err := replace(path, data, perm, false); err != nil {
		return err
	}
	d.mu.Lock()
	d.pending[path] = struct{}{}
	if !d.running {
		d.running = true
		go d.flush()
	}
	d.mu.Unlock()
	return nil
}

// Flush waits until every file written so far is durable (or its fsync
// failed and was reported).
func (d *Deferred) Flush() {
	if d == nil {
		return
	}
	d.mu.Lock()
	for d.running {
		d.idle.Wait()
	}
	d.mu.Unlock()
}

// flush fsyncs pending files, then their directories, until none are
// left. Files written while it works are taken in the next round.
func (d *Deferred) flush() {
	for {
		d.mu.Lock()
		batch := d.pending
		if len(batch) == 0 {
			d.running = false
			d.idle.Broadcast()
			d.mu.Unlock()
			return
		}
		d.pending = map[string]struct{}{}
		d.mu.Unlock()
		dirs := map[string]struct{}{}
		for path := range batch {
			d.report(path, syncPath(path))
			dirs[filepath.Dir(path)] = struct{}{}
		}
		for dir := range dirs {
			d.report(dir, syncPath(dir))
		}
	}
}

func (d *Deferred) report(path string, err error) {
	if err != nil && d.OnError != nil {
		d.OnError(path, err)
	}
}

// syncPath fsyncs a file or directory by path. One removed meanwhile
// needs no durability.
func syncPath(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "sync", Path: path, Err: err}
	}
	return nil
}
