package monitor

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// serveConn answers the requests on one connection. Two ops take the
// connection over: attach turns it into a frame stream, and a wait on a
// running container parks it on the container (wait.go).
func (p *Pod) serveConn(conn *os.File) {
	parked := false // a wait holds the connection now
	defer func() {
		if !parked {
			conn.Close()
		}
	}()
	for {
		req, ok := readRequest(conn, conn)
		if !ok {
			return
		}
		switch req.Op {
		case proto.OpAttach:
			p.attach(conn, req)
			return
		case proto.OpWait:
			var err error
			if parked, err = p.wait(conn, req); parked || err != nil {
				return
			}
			continue
		}
		p.mon.answering.Add(1)
		resp, exit := p.handle(req)
		err := proto.WriteResponse(conn, resp)
		p.mon.answering.Add(-1)
		if err != nil {
			return
		}
		p.mon.scheduleTrim()
		if exit {
			// The pod is gone; its last response is out.
			return
		}
	}
}

// readRequest reads the next request from r, conn's reader; ok is false
// when the connection is done (closed, or a request that does not decode,
// which is answered on conn with InvalidArgument first).
func readRequest(r io.Reader, conn *os.File) (req *proto.Request, ok bool) {
	body, err := proto.ReadMessage(r)
	if err != nil {
		return nil, false
	}
	req, err = proto.DecodeRequest(body)
	if err != nil {
		_ = proto.WriteResponse(conn, proto.ErrorResponse(fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)))
		return nil, false
	}
	return req, true
}

// handle runs one op; exit is true when the pod should now end. A new
// op is a case here; one that adds a container registers it and launches
// it with its own runtime step (lifecycle.go).
func (p *Pod) handle(req *proto.Request) (resp *proto.Response, exit bool) {
	switch req.Op {
	case proto.OpPing:
		return &proto.Response{IDs: p.ids()}, false
	case proto.OpShutdown:
		if !p.exitIfEmpty() {
			return proto.ErrorResponse(fmt.Errorf("the pod holds containers: %w", errdefs.ErrFailedPrecondition)), false
		}
		return &proto.Response{}, true
	case proto.OpCreate:
		if err := p.create(req); err != nil {
			// A pod whose first create failed has nothing to hold.
			return proto.ErrorResponse(err), p.exitIfEmpty()
		}
		return &proto.Response{}, false
	}
	c, err := p.get(req.ID)
	if err != nil {
		return proto.ErrorResponse(err), false
	}
	switch req.Op {
	case proto.OpState:
		// The state below is the answer.
	case proto.OpStart:
		err = p.start(c)
	case proto.OpKill:
		err = p.kill(c, syscall.Signal(req.Signal), req.All)
	case proto.OpReopenLog:
		err = c.reopenLog()
	case proto.OpDelete:
		if err = p.delete(c); err == nil {
			return &proto.Response{State: c.state()}, p.exitIfEmpty()
		}
	default:
		err = fmt.Errorf("unknown op %q: %w", req.Op, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return proto.ErrorResponse(err), false
	}
	return &proto.Response{State: c.state()}, false
}
