// Package admin is berth's administration gRPC service (berthctl talks to
// it on the CRI socket): image import and export, which CRI has no RPC for.
// It is defined without protoc: a hand-written grpc.ServiceDesc whose
// messages are protobuf well-known types.
//
//	berth.admin.v1.Admin/ImportImage  client stream of BytesValue (archive chunks) → Struct {"images": [{"id", "repoTags", "repoDigests"}]}
//	berth.admin.v1.Admin/ExportImage  StringValue (image reference) → server stream of BytesValue (docker-archive chunks)
//	berth.admin.v1.Admin/Config       Empty → Struct {"generation", "toml", "liveKeys", "reloads": {result: n}, "lastReload"}: the configuration in effect
package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/berthcri/berth/internal/errdefs/errgrpc"
	"github.com/berthcri/berth/internal/image"
)

// ServiceName is the gRPC service's full name.
const ServiceName = "berth.admin.v1.Admin"

// Full method names.
const (
	ImportImageMethod = "/" + ServiceName + "/ImportImage"
	ExportImageMethod = "/" + ServiceName + "/ExportImage"
	ConfigMethod      = "/" + ServiceName + "/Config"
)

// chunkSize bounds each streamed message well below gRPC's 4 MiB default.
const chunkSize = 1 << 20

// Server implements the admin service over the image store.
type Server struct {
	images *image.Store
	log    *slog.Logger
	config func() (map[string]any, error)
}

// WithConfig makes Config answer with what fn returns: the configuration
// in effect and the reloads' results.
func (s *Server) WithConfig(fn func() (map[string]any, error)) *Server {
	s.config = fn
	return s
}

// New builds the admin service.
func New(images *image.Store, log *slog.Logger) *Server {
	return &Server{images: images, log: log}
}

// adminServer is the handler type the ServiceDesc names.
type adminServer interface {
	importImage(grpc.ServerStream) error
	exportImage(*wrapperspb.StringValue, grpc.ServerStream) error
	configInfo(context.Context, *emptypb.Empty) (*structpb.Struct, error)
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*adminServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Config",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(emptypb.Empty)
			if err := dec(req); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) {
				return srv.(adminServer).configInfo(ctx, req.(*emptypb.Empty))
			}
			if interceptor == nil {
				return call(ctx, req)
			}
			return interceptor(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: ConfigMethod}, call)
		},
	}},
	Streams: []grpc.StreamDesc{
		{
			StreamName:    "ImportImage",
			ClientStreams: true,
			Handler: func(srv any, stream grpc.ServerStream) error {
				return srv.(adminServer).importImage(stream)
			},
		},
		{
			StreamName:    "ExportImage",
			ServerStreams: true,
			Handler: func(srv any, stream grpc.ServerStream) error {
				req := new(wrapperspb.StringValue)
				if err := stream.RecvMsg(req); err != nil {
					return err
				}
				return srv.(adminServer).exportImage(req, stream)
			},
		},
	},
	Metadata: "berth/admin/v1 (hand-written, no .proto)",
}

// Register attaches the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { g.RegisterService(&serviceDesc, s) }

func (s *Server) importImage(stream grpc.ServerStream) error {
	pr, pw := io.Pipe()
	go func() {
		for {
			chunk := new(wrapperspb.BytesValue)
			err := stream.RecvMsg(chunk)
			if errors.Is(err, io.EOF) {
				pw.Close()
				return
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			if _, err := pw.Write(chunk.GetValue()); err != nil {
				return // Import stopped reading; its error is returned below
			}
		}
	}()
	imgs, err := s.images.Import(stream.Context(), pr)
	pr.CloseWithError(errors.New("import finished"))
	if err != nil {
		return toStatus(err)
	}
	list := make([]any, 0, len(imgs))
	for _, img := range imgs {
		s.log.Info("image imported", "image", img.ID, "tags", img.RepoTags)
		list = append(list, map[string]any{
			"id":          img.ID,
			"repoTags":    toAnySlice(img.RepoTags),
			"repoDigests": toAnySlice(img.RepoDigests),
		})
	}
	res, err := structpb.NewStruct(map[string]any{"images": list})
	if err != nil {
		return toStatus(fmt.Errorf("encode import result: %w", err))
	}
	return stream.SendMsg(res)
}

func (s *Server) configInfo(context.Context, *emptypb.Empty) (*structpb.Struct, error) {
	if s.config == nil {
		return nil, status.Error(codes.Unimplemented, "Config: this berthd does not report its configuration")
	}
	m, err := s.config()
	if err != nil {
		return nil, toStatus(fmt.Errorf("report the configuration: %w", err))
	}
	res, err := structpb.NewStruct(m)
	if err != nil {
		return nil, toStatus(fmt.Errorf("encode the configuration: %w", err))
	}
	return res, nil
}

func (s *Server) exportImage(req *wrapperspb.StringValue, stream grpc.ServerStream) error {
	if req.GetValue() == "" {
		return status.Error(codes.InvalidArgument, "ExportImage: image reference is required")
	}
	w := &chunkWriter{stream: stream}
	if err := s.images.Export(stream.Context(), req.GetValue(), w); err != nil {
		return toStatus(err)
	}
	return w.flush()
}

// chunkWriter turns a byte stream into BytesValue messages of chunkSize.
type chunkWriter struct {
	stream grpc.ServerStream
	buf    []byte
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		take := min(chunkSize-len(c.buf), len(p))
		c.buf = append(c.buf, p[:take]...)
		p = p[take:]
		if len(c.buf) == chunkSize {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkWriter) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	err := c.stream.SendMsg(wrapperspb.Bytes(c.buf))
	c.buf = c.buf[:0]
	return err
}

func toAnySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func toStatus(err error) error { return errgrpc.ToGRPC(err) }

// ImportImage streams an image archive to the daemon and returns the
// images it stored.
func ImportImage(ctx context.Context, conn grpc.ClientConnInterface, r io.Reader) (*structpb.Struct, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.NewStream(ctx, &serviceDesc.Streams[0], ImportImageMethod)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, chunkSize)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := stream.SendMsg(wrapperspb.Bytes(buf[:n])); err != nil {
				if errors.Is(err, io.EOF) {
					break // the server ended the call; RecvMsg has its status
				}
				return nil, err
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read archive: %w", rerr)
		}
	}
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	res := new(structpb.Struct)
	if err := stream.RecvMsg(res); err != nil {
		return nil, err
	}
	return res, nil
}

// ExportImage writes the image ref names, as a docker-archive, to w.
func ExportImage(ctx context.Context, conn grpc.ClientConnInterface, ref string, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.NewStream(ctx, &serviceDesc.Streams[1], ExportImageMethod)
	if err != nil {
		return err
	}
	if err := stream.SendMsg(wrapperspb.String(ref)); err != nil {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		chunk := new(wrapperspb.BytesValue)
		err := stream.RecvMsg(chunk)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := w.Write(chunk.GetValue()); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
}

// Config asks the daemon for the configuration in effect and what its
// reloads did (see the Config method above).
func Config(ctx context.Context, conn grpc.ClientConnInterface) (*structpb.Struct, error) {
	res := new(structpb.Struct)
	if err := conn.Invoke(ctx, ConfigMethod, new(emptypb.Empty), res); err != nil {
		return nil, err
	}
	return res, nil
}
