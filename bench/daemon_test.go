package bench

import (
	"context"
	"os"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// BenchmarkRPCRoundTrip measures the floor every CRI call pays: a Version
// and a Status round trip over the unix socket.
func BenchmarkRPCRoundTrip(b *testing.B) {
	d := berthdtest.Start(b, berthdtest.Options{})
	ctx := context.Background()
	version := Series{Name: "Version"}
	status := Series{Name: "Status"}
	for i := 0; i < 20; i++ { // warm up
		d.Runtime.Version(ctx, &criapi.VersionRequest{})
	}
	for i := 0; i < 200; i++ {
		start := time.Now()
		if _, err := d.Runtime.Version(ctx, &criapi.VersionRequest{}); err != nil {
			b.Fatal(err)
		}
		version.Samples = append(version.Samples, time.Since(start))
		start = time.Now()
		if _, err := d.Runtime.Status(ctx, &criapi.StatusRequest{}); err != nil {
			b.Fatal(err)
		}
		status.Samples = append(status.Samples, time.Since(start))
	}
	if err := Report(os.Stdout, "rpc_round_trip", version, status); err != nil {
		b.Fatal(err)
	}
}
