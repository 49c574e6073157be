package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
	"github.com/berthcri/berth/internal/sockbind"
)

// The range socket (decision 3600, S4): berth-lazy asks berthd, on
// <root>/lazy.sock, for the bytes of a lazy layer's blob it does not have
// on disk; berthd reads them from the registry of the pull that found
// the layer, with that pull's credentials, which stay in berthd's memory
// (decision 3410). The server verifies each chunk against the TOC as it
// would the registry's bytes. One listener per berthd, from Open to Close.

// rangeSocket is berthd's listener for range requests.
type rangeSocket struct {
	ln     net.Listener
	path   string
	cancel context.CancelFunc
	done   chan struct{}
}

// listenRanges serves the range socket at s.lazySock. A socket that
// cannot be made leaves the store without lazy layers (they are pulled
// whole), logged.
func (s *Store) listenRanges() {
	if s.lazy.holder == nil || s.lazySock == "" {
		s.lazySock = ""
		return
	}
	r, err := openRangeSocket(s.lazySock)
	if err != nil {
		s.log.Warn("lazy layers: no range socket; eStargz layers are pulled whole", "error", err)
		s.lazySock = ""
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		if err := lazysrv.ServeRanges(ctx, r.ln, s.log.With("component", "lazy-ranges"), s.lazy.source); err != nil {
			s.log.Error("lazy range socket", "error", err)
		}
	}()
	s.ranges = r
}

// openRangeSocket listens at path (0600), replacing what a previous
// berthd left there (the socket, a stale private dir). Only root's: the
// answers are registry content fetched with the pulls' credentials, and
// path's directory (berthd's root) is one others may traverse; sockbind
// binds it so that it never exists at path with a wider mode (as the CRI
// socket, daemon.listenUnix).
func openRangeSocket(path string) (*rangeSocket, error) {
	ln, err := sockbind.Listen(path, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lazy range socket: %w", err)
	}
	return &rangeSocket{ln: ln, path: path, done: make(chan struct{})}, nil
}

// closeRanges stops serving the range socket and removes its file;
// answers under way are cancelled.
func (s *Store) closeRanges() {
	if s.ranges == nil {
		return
	}
	s.ranges.ln.Close()
	if err := os.Remove(s.ranges.path); err != nil && !os.IsNotExist(err) {
		s.log.Warn("lazy range socket: remove it", "path", s.ranges.path, "error", err)
	}
	s.ranges.cancel()
	<-s.ranges.done
}

// rangeRetryFirst is the first back-off of a range request asked again.
const rangeRetryFirst = 100 * time.Millisecond

// retrySource asks the registry for a range as a lazy layer in berthd
// did before S4: each request bounded by timeout, a failed one asked
// again retries times with back-off from rangeRetryFirst
// (image_range_fetch.retries). Its failure is final for the server
// (lazy.ErrGivenUp), so a registry gone fails a read in about the same
// time as before.
type retrySource struct {
	src     lazy.Source
	retries int
	timeout time.Duration
}

func (r *retrySource) Size() int64 { return r.src.Size() }

func (r *retrySource) OpenRange(ctx context.Context, start, end int64) (io.ReadCloser, error) {
	delay := rangeRetryFirst
	var last error
	for attempt := 0; attempt <= r.retries; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			delay *= 2
		}
		actx, cancel := context.WithTimeout(ctx, r.timeout)
		body, err := r.src.OpenRange(actx, start, end)
		if err == nil {
			return &cancelBody{ReadCloser: body, cancel: cancel}, nil
		}
		cancel()
		if ctx.Err() != nil || errors.Is(err, lazy.ErrNoRanges) {
			return nil, err
		}
		last = err
	}
	return nil, last
}

// cancelBody ends its request's context when closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
