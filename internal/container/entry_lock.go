package container

import (
	"context"
	"fmt"
)

// entryMu is the container's lifecycle lock: a mutex whose waiters can
// give up with their context. A stop waiting on a hung monitor holds it
// for as long as the monitor takes (decision 3300: up to the keeper's
// replacing it); every call queued behind it (the kubelet retries its
// stop, an exec probe) leaves at its own deadline instead of holding a
// goroutine until the lock frees. Make it with newEntryMu.
type entryMu struct{ ch chan struct{} }

func newEntryMu() entryMu { return entryMu{ch: make(chan struct{}, 1)} }

// Lock waits for the lock, however long.
func (m entryMu) Lock() { m.ch <- struct{}{} }

// LockCtx waits for the lock until ctx ends.
func (m entryMu) LockCtx(ctx context.Context) error {
	select {
	case m.ch <- struct{}{}:
		return nil
	default:
	}
	select {
	case m.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for another operation on the container: %w", ctx.Err())
	}
}

// TryLock takes the lock if it is free.
func (m entryMu) TryLock() bool {
	select {
	case m.ch <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock lets go of the lock; it must be held.
func (m entryMu) Unlock() {
	select {
	case <-m.ch:
	default:
		panic("container: unlock of an unlocked entry")
	}
}
