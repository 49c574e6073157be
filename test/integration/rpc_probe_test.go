package integration

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// criRPCs is how many RPCs runtime.v1 has in the cri-api berth builds
// against (v0.37: RuntimeService and ImageService together).
const criRPCs = 43

// TestEveryCRIRPCIsImplemented is the RPC probe: it calls each of the
// CRI's RPCs, unary and streaming, with an empty (so minimal or bad)
// request and fails for any that answers Unimplemented. What the others
// answer (OK, InvalidArgument, NotFound, ...) is not its business.
func TestEveryCRIRPCIsImplemented(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	total := 0
	for _, sd := range []grpc.ServiceDesc{criapi.RuntimeService_ServiceDesc, criapi.ImageService_ServiceDesc} {
		for _, m := range sd.Methods {
			total++
			name := "/" + sd.ServiceName + "/" + m.MethodName
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := conn.Invoke(ctx, name, &emptypb.Empty{}, &emptypb.Empty{})
			cancel()
			check(t, name, err)
		}
		for _, st := range sd.Streams {
			total++
			name := "/" + sd.ServiceName + "/" + st.StreamName
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			check(t, name, callStream(ctx, conn, &st, name))
			cancel()
		}
	}
	if total != criRPCs {
		t.Errorf("probed %d RPCs, runtime.v1 has %d", total, criRPCs)
	}
}

func check(t *testing.T, name string, err error) {
	t.Helper()
	code := status.Code(err)
	t.Logf("%s: %s", name, code)
	if code == codes.Unimplemented {
		t.Errorf("%s is Unimplemented: %v", name, err)
	}
}

// callStream opens a server stream, sends an empty request and reads
// until the first response or the end: EOF is success.
func callStream(ctx context.Context, conn *grpc.ClientConn, sd *grpc.StreamDesc, name string) error {
	s, err := conn.NewStream(ctx, sd, name)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&emptypb.Empty{}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	err = s.RecvMsg(&emptypb.Empty{})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
