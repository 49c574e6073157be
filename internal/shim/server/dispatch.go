package server

import (
	"fmt"
	"os"
	"syscall"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/shim/proto"
)

// serveConn answers the requests on one connection. Two ops take the
// connection over: attach turns it into a frame stream, and a wait on a
// running container parks it on the container (wait.go).
func (s *Server) serveConn(conn *os.File) {
	parked := false // a wait holds the connection now
	defer func() {
		if !parked {
			conn.Close()
		}
	}()
	for {
		req, ok := readRequest(conn)
		if !ok {
			return
		}
		switch req.Op {
		case proto.OpAttach:
			s.attach(conn, req)
			return
		case proto.OpWait:
			var err error
			if parked, err = s.wait(conn, req); parked || err != nil {
				return
			}
			continue
		}
		s.node.answering.Add(1)
		resp, exit := s.handle(req)
		err := proto.WriteResponse(conn, resp)
		s.node.answering.Add(-1)
		if err != nil {
			return
		}
		s.node.scheduleTrim()
		if exit {
			// The pod is gone; its last response is out.
			return
		}
	}
}

// readRequest reads the next request on conn; ok is false when the
// connection is done (closed, or a request that does not decode, which is
// answered with InvalidArgument first).
func readRequest(conn *os.File) (req *proto.Request, ok bool) {
	body, err := proto.ReadMessage(conn)
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

// handle runs one op; exit is true when the shim should now exit. A new
// op is a case here; one that adds a container registers it and launches
// it with its own runtime step (lifecycle.go).
func (s *Server) handle(req *proto.Request) (resp *proto.Response, exit bool) {
	switch req.Op {
	case proto.OpPing:
		return &proto.Response{IDs: s.ids()}, false
	case proto.OpShutdown:
		if !s.exitIfEmpty() {
			return proto.ErrorResponse(fmt.Errorf("shim holds containers: %w", errdefs.ErrFailedPrecondition)), false
		}
		return &proto.Response{}, true
	case proto.OpCreate:
		if err := s.create(req); err != nil {
			// A shim whose first create failed has nothing to hold.
			return proto.ErrorResponse(err), s.exitIfEmpty()
		}
		return &proto.Response{}, false
	}
	c, err := s.get(req.ID)
	if err != nil {
		return proto.ErrorResponse(err), false
	}
	switch req.Op {
	case proto.OpState:
		// The state below is the answer.
	case proto.OpStart:
		err = s.start(c)
	case proto.OpKill:
		err = s.kill(c, syscall.Signal(req.Signal), req.All)
	case proto.OpReopenLog:
		err = c.reopenLog()
	case proto.OpDelete:
		if err = s.delete(c); err == nil {
			return &proto.Response{State: c.state()}, s.exitIfEmpty()
		}
	default:
		err = fmt.Errorf("unknown op %q: %w", req.Op, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return proto.ErrorResponse(err), false
	}
	return &proto.Response{State: c.state()}, false
}
