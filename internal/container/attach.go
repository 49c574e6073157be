package container

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim"
)

// TerminalSize is a resize request for a TTY container.
type TerminalSize struct {
	Width, Height uint16
}

// Attach connects the caller's streams to a running container through its
// shim: in feeds the container's stdin (its EOF closes stdin when the
// container is stdin_once), out and errOut get its output (a TTY container
// has only out). It returns when the container exits, ctx ends or the
// output cannot be written. Any stream may be nil.
func (s *Store) Attach(ctx context.Context, id string, in io.Reader, out, errOut io.Writer, resize <-chan TerminalSize) error {
	c, err := s.Get(id)
	if err != nil {
		return err
	}
	if c.State != StateRunning {
		return fmt.Errorf("container %s is %s, not running: %w", c.ID, c.State, errdefs.ErrFailedPrecondition)
	}
	if in != nil && !c.Stdin {
		return fmt.Errorf("container %s was not created with stdin: %w", c.ID, errdefs.ErrInvalidArgument)
	}
	stream, err := s.shims.Pod(c.PodID).Attach(ctx, c.ID, in != nil, out != nil, errOut != nil && !c.Terminal)
	if err != nil {
		return fmt.Errorf("attach to %s: %w", c.ID, err)
	}
	defer stream.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		stream.Close()
	}()
	// Stdin and resize frames come from two goroutines: one writer at a time.
	var wmu sync.Mutex
	send := func(f func() error) error {
		wmu.Lock()
		defer wmu.Unlock()
		return f()
	}
	if in != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 && send(func() error { return stream.Stdin(buf[:n]) }) != nil {
					return
				}
				if err != nil {
					// The shim closes stdin only for stdin_once containers.
					_ = send(stream.CloseStdin)
					return
				}
			}
		}()
	}
	if resize != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case sz, ok := <-resize:
					if !ok || send(func() error { return stream.Resize(sz.Width, sz.Height) }) != nil {
						return
					}
				}
			}
		}()
	}
	for {
		kind, p, err := stream.Recv()
		if err != nil {
			// The shim closes the stream when the container exits.
			return nil
		}
		w := out
		if kind == shim.FrameStderr {
			w = errOut
		}
		if w == nil {
			continue
		}
		if _, err := w.Write(p); err != nil {
			return fmt.Errorf("attach to %s: write output: %w", c.ID, err)
		}
	}
}
