package shim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Lazy layers held by the node's keeper (decision 3600, S4): berthd
// mounts a lazy layer, hands its FUSE connection to the node's keeper
// through the monitor's node.sock, and closes its own copy; the keeper
// holds it for as long as the layer exists and runs berth-lazy, which
// serves it. So the layer outlives berthd, and its server's crashes.

// HoldLazyLayer hands the node's keeper (through its monitor, launching
// the node's keeper and monitor when none runs) a duplicate of a lazy
// layer's FUSE connection fd; the keeper holds it as long as the layer
// exists and berth-lazy serves it from layerDir. The caller may close
// conn after it returns.
func HoldLazyLayer(ctx context.Context, binary, shimsDir, chainID, layerDir string, conn *os.File) error {
	err := proto.CheckChainID(chainID)
	if err == nil {
		err = proto.CheckLayerDir(layerDir)
	}
	if err == nil && conn == nil {
		err = errors.New("no FUSE connection")
	}
	if err != nil {
		return fmt.Errorf("hold lazy layer: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	// The keeper starts the server from beside its own binary: without
	// it, the layer would be held and never served.
	server := filepath.Join(filepath.Dir(binary), proto.LazyServerBinary)
	if _, err := os.Stat(server); err != nil {
		return fmt.Errorf("hold lazy layer %s: the lazy-layer server: %w: %w", chainID, err, errdefs.ErrFailedPrecondition)
	}
	nodeDir := proto.NodeDir(shimsDir)
	req := &proto.Request{Op: proto.OpLazyHold, ID: chainID, Dir: layerDir}
	hold := func(ctx context.Context) error {
		_, err := callNodeWithFd(ctx, nodeDir, req, conn)
		if err != nil && monitorGone(err) && !errors.Is(err, errdefs.ErrUnavailable) {
			// Cut before the answer: held or not, a hold again is safe
			// (it replaces the first), once a monitor listens.
			return fmt.Errorf("%v: %w", err, ErrNoShim)
		}
		return err
	}
	return onNode(ctx, binary, nodeDir, "hold lazy layer "+chainID, hold)
}

// DropLazyLayer tells the keeper the layer is gone (after its unmount).
// No node running: nil.
func DropLazyLayer(ctx context.Context, shimsDir, chainID string) error {
	if err := proto.CheckChainID(chainID); err != nil {
		return fmt.Errorf("drop lazy layer: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	nodeDir := proto.NodeDir(shimsDir)
	_, err := onRunningNode(ctx, nodeDir, func(ctx context.Context) (*proto.Response, error) {
		return nodeClient(nodeDir).callOnce(ctx, &proto.Request{Op: proto.OpLazyDrop, ID: chainID})
	})
	if err != nil {
		return fmt.Errorf("drop lazy layer %s: %w", chainID, err)
	}
	return nil
}

// HeldLazyLayers lists the chain IDs the node's keeper holds. No node
// running: empty, nil.
func HeldLazyLayers(ctx context.Context, shimsDir string) ([]string, error) {
	nodeDir := proto.NodeDir(shimsDir)
	resp, err := onRunningNode(ctx, nodeDir, func(ctx context.Context) (*proto.Response, error) {
		return nodeClient(nodeDir).callOnce(ctx, &proto.Request{Op: proto.OpLazyList})
	})
	if err != nil {
		return nil, fmt.Errorf("list the lazy layers the node holds: %w", err)
	}
	if resp == nil {
		return nil, nil
	}
	return resp.IDs, nil
}

// onRunningNode runs op on the node's monitor if the node runs: a
// monitor that is restarting (its keeper lives, or a launch holds the
// lock) is waited for, at most readyTimeout; with no keeper, op is not
// run and the response is nil.
func onRunningNode(ctx context.Context, nodeDir string, op func(context.Context) (*proto.Response, error)) (*proto.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		resp, err := op(ctx)
		if err == nil || !errors.Is(err, errdefs.ErrUnavailable) && !monitorGone(err) {
			return resp, err
		}
		if !keeperMayLive(nodeDir) {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the node's keeper lives, its monitor did not answer: %w (%v)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// callNodeWithFd is callOnce on the node's socket with fd riding along
// the request (SCM_RIGHTS, on its first bytes).
func callNodeWithFd(ctx context.Context, nodeDir string, req *proto.Request, fd *os.File) (*proto.Response, error) {
	conn, err := nodeClient(nodeDir).dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var msg bytes.Buffer
	if err := proto.WriteRequest(&msg, req); err != nil {
		return nil, err
	}
	b := msg.Bytes()
	// Through Control, not Fd: Fd would make the caller's file blocking.
	rc, err := fd.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("shim %s %s: %w", req.Op, req.ID, err)
	}
	var n int
	var werr error
	if err := rc.Control(func(raw uintptr) {
		n, _, werr = conn.WriteMsgUnix(b, syscall.UnixRights(int(raw)), nil)
	}); err != nil {
		return nil, fmt.Errorf("shim %s %s: %w", req.Op, req.ID, err)
	}
	if werr == nil && n < len(b) {
		_, werr = conn.Write(b[n:])
	}
	if werr != nil {
		return nil, fmt.Errorf("shim %s %s: %w", req.Op, req.ID, ctxEnded(ctx, werr))
	}
	resp, err := proto.ReadResponse(conn)
	if err != nil {
		return nil, fmt.Errorf("shim %s %s: %w", req.Op, req.ID, ctxEnded(ctx, err))
	}
	return resp, resp.Err()
}
