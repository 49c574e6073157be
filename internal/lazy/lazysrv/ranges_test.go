package lazysrv_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/lazysrv"
)

// failingSource is a registry that answers every range with an error.
type failingSource struct{}

func (failingSource) Size() int64 { return 1 << 20 }

func (failingSource) OpenRange(context.Context, int64, int64) (io.ReadCloser, error) {
	return nil, errors.New("registry gone")
}

// TestAskRangeFinalOnlyWhenBerthdTriedTheRegistry: a range berthd could
// not get from the registry (it retried as configured) is final
// (lazy.ErrGivenUp: the server fails the read at once); a layer berthd
// does not serve (yet: as while it takes its layers up after a restart)
// and a range out of bounds are not, so the server asks again.
func TestAskRangeFinalOnlyWhenBerthdTriedTheRegistry(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "lazy.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- lazysrv.ServeRanges(context.Background(), ln, slog.New(slog.DiscardHandler), func(layer string) (lazy.Source, bool) {
			return failingSource{}, layer == "sha256:served"
		})
	}()
	t.Cleanup(func() {
		ln.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	for _, tc := range []struct {
		layer      string
		start, end int64
		final      bool
		says       string
	}{
		{"sha256:served", 0, 10, true, "registry gone"},
		{"sha256:other", 0, 10, false, "no such lazy layer"},
		{"sha256:served", 0, 2 << 20, false, "out of bounds"},
	} {
		_, err := lazysrv.AskRange(context.Background(), sock, lazysrv.RangeRequest{Layer: tc.layer, Start: tc.start, End: tc.end})
		if err == nil || errors.Is(err, lazy.ErrGivenUp) != tc.final || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s %d-%d: %v, want final %v saying %q", tc.layer, tc.start, tc.end, err, tc.final, tc.says)
		}
	}
}
