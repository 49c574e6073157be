package daemon

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// unaryLogger logs every request at debug with its method and duration, and
// failed ones at error with the gRPC code.
func unaryLogger(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		logRPC(ctx, log, info.FullMethod, start, err)
		return resp, err
	}
}

func streamLogger(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		logRPC(ss.Context(), log, info.FullMethod, start, err)
		return err
	}
}

func logRPC(ctx context.Context, log *slog.Logger, method string, start time.Time, err error) {
	d := time.Since(start)
	if err != nil {
		st := status.Convert(err)
		log.LogAttrs(ctx, slog.LevelError, "request failed",
			slog.String("method", method), slog.Duration("duration", d),
			slog.String("code", st.Code().String()), slog.String("error", st.Message()))
		return
	}
	log.LogAttrs(ctx, slog.LevelDebug, "request", slog.String("method", method), slog.Duration("duration", d))
}
