package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
)

// AttachOptions are the caller's ends of an attach session.
type AttachOptions struct {
	Stdin  io.Reader // ignored unless the container was created with stdin
	Stdout io.Writer
	Stderr io.Writer // unused for a TTY container: its output is one stream
	Resize <-chan TerminalSize
}

// Attach connects the caller's streams to the running container's stdio
// through the pod's shim, until the container exits, the shim closes the
// session or ctx ends. With stdin_once, the container's stdin closes when
// the caller's stdin does (kubelet semantics); otherwise other attachers
// keep it.
func (s *Store) Attach(ctx context.Context, id string, o AttachOptions) error {
	e, err := s.entry(id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	s.refresh(e)
	rec := e.rec.clone()
	e.mu.Unlock()
	if rec.State != StateRunning {
		return fmt.Errorf("attach to container %s: it is %s, not running: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	wantStdin := o.Stdin != nil && rec.Stdin
	wantStderr := o.Stderr != nil && !rec.Terminal
	stream, err := s.shimClient(rec.PodID).Attach(ctx, rec.ID, wantStdin, o.Stdout != nil, wantStderr)
	if err != nil {
		return fmt.Errorf("attach to container %s: %w", rec.ID, err)
	}
	defer stream.Close()
	stop := context.AfterFunc(ctx, func() { stream.Close() })
	defer stop()

	// Frames from several goroutines must not interleave on the socket.
	var wmu sync.Mutex
	send := func(f func() error) error {
		wmu.Lock()
		defer wmu.Unlock()
		return f()
	}
	if wantStdin {
		go func() {
			buf := make([]byte, 16*1024)
			for {
				n, err := o.Stdin.Read(buf)
				if n > 0 {
					if send(func() error { return stream.Stdin(buf[:n]) }) != nil {
						return
					}
				}
				if err != nil {
					if rec.StdinOnce {
						_ = send(stream.CloseStdin)
					}
					return
				}
			}
		}()
	}
	if o.Resize != nil && rec.Terminal {
		go func() {
			for sz := range o.Resize {
				if send(func() error { return stream.Resize(sz.Width, sz.Height) }) != nil {
					return
				}
			}
		}()
	}
	for {
		kind, p, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("attach to container %s: %w", rec.ID, err)
		}
		var w io.Writer
		switch kind {
		case shim.FrameStdout:
			w = o.Stdout
		case shim.FrameStderr:
			w = o.Stderr
		}
		if w != nil {
			if _, err := w.Write(p); err != nil {
				return nil // the client went away
			}
		}
	}
}
