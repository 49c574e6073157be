package cri

import (
	"bytes"
	"context"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/container"
)

// maxExecSyncOutput caps each of stdout and stderr, as the kubelet does for
// probe output: a probe printing without end must not exhaust berthd.
const maxExecSyncOutput = 16 << 20

// ExecSync runs a command in a running container and returns its output
// and exit code. A timeout kills the command (it never outlives the call)
// and answers DeadlineExceeded, which the kubelet reports as a probe
// timeout.
func (s *Service) ExecSync(ctx context.Context, req *runtime.ExecSyncRequest) (*runtime.ExecSyncResponse, error) {
	if req.GetContainerId() == "" {
		return nil, invalidArgument("ExecSync: container_id is required")
	}
	if len(req.GetCmd()) == 0 {
		return nil, invalidArgument("ExecSync: cmd is required")
	}
	if req.GetTimeout() < 0 {
		return nil, invalidArgument("ExecSync: timeout %d is negative", req.GetTimeout())
	}
	var stdout, stderr cappedBuffer
	stdout.max, stderr.max = maxExecSyncOutput, maxExecSyncOutput
	code, err := s.containers.Exec(ctx, req.GetContainerId(), container.ExecOptions{
		Cmd:     req.GetCmd(),
		Stdout:  &stdout,
		Stderr:  &stderr,
		Timeout: time.Duration(req.GetTimeout()) * time.Second,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &runtime.ExecSyncResponse{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: int32(code)}, nil
}

// cappedBuffer keeps the first max bytes written and drops the rest, so
// that the writer never blocks on a full pipe. (Not an embedded
// bytes.Buffer: io.Copy would use its ReadFrom and bypass the cap.)
type cappedBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.max - b.buf.Len(); room > 0 {
		if len(p) > room {
			p = p[:room]
		}
		b.buf.Write(p)
	}
	return n, nil
}

// Bytes is what was kept.
func (b *cappedBuffer) Bytes() []byte { return b.buf.Bytes() }
