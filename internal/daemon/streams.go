package daemon

import (
	"context"
	"fmt"
	"io"
	"reflect"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
	"github.com/berthcri/berth/internal/sandbox"
	"github.com/berthcri/berth/internal/streaming"
)

// containerStreams runs exec and attach sessions for the streaming server.
type containerStreams struct{ containers *container.Store }

func (c containerStreams) Exec(ctx context.Context, id string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan streaming.TerminalSize) error {
	code, err := c.containers.Exec(ctx, id, container.ExecOptions{
		Cmd: cmd, Stdin: readerOrNil(in), Stdout: writerOrNil(out), Stderr: writerOrNil(errOut), TTY: tty, Resize: sizes(ctx, resize),
	})
	if err != nil {
		return err
	}
	if code != 0 {
		// The streaming library reports this to the client as the exit code.
		return streaming.ExitCode(code)
	}
	return nil
}

func (c containerStreams) Attach(ctx context.Context, id string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan streaming.TerminalSize) error {
	return c.containers.Attach(ctx, id, readerOrNil(in), writerOrNil(out), writerOrNil(errOut), sizes(ctx, resize))
}

// writerOrNil keeps a nil interface nil: the library passes typed nils for
// streams the client did not ask for.
func writerOrNil(w io.WriteCloser) io.Writer {
	if isNil(w) {
		return nil
	}
	return w
}

func readerOrNil(r io.Reader) io.Reader {
	if isNil(r) {
		return nil
	}
	return r
}

// isNil reports a nil interface or an interface holding a nil pointer.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Chan, reflect.Func, reflect.Slice:
		return rv.IsNil()
	}
	return false
}

// sizes converts the library's resize events until ctx ends.
func sizes(ctx context.Context, in <-chan streaming.TerminalSize) <-chan container.TerminalSize {
	if in == nil {
		return nil
	}
	out := make(chan container.TerminalSize)
	go func() {
		defer close(out)
		for {
			select {
			case sz, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- container.TerminalSize{Width: sz.Width, Height: sz.Height}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// podNetwork finds a ready pod's network namespace for port-forward.
type podNetwork struct{ sandboxes *sandbox.Store }

func (p podNetwork) NetNSPath(id string) (string, error) {
	sb, err := p.sandboxes.Get(id)
	if err != nil {
		return "", err
	}
	if sb.State != criapi.PodSandboxState_SANDBOX_READY {
		return "", fmt.Errorf("pod sandbox %s is not ready", id)
	}
	return sb.NetNSPath, nil
}
