package testimages

import (
	"context"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/berthcri/berth/internal/image/estargzconv"
)

// EStargz is img with every layer rewritten into eStargz (decision 3600),
// the prioritized files first, exactly as `berthctl image convert
// --estargz` makes it. The converted layers live in a temporary directory
// of t until the test ends.
func EStargz(t testing.TB, img v1.Image, prioritized ...string) v1.Image {
	t.Helper()
	res, err := estargzconv.Convert(context.Background(), img, estargzconv.Options{
		Prioritized: prioritized,
		TempDir:     t.TempDir(),
	})
	if err != nil {
		t.Fatalf("convert test image to eStargz: %v", err)
	}
	if len(res.MissedPrioritized) > 0 {
		t.Fatalf("convert test image to eStargz: prioritized files in no layer: %q", res.MissedPrioritized)
	}
	return res.Image
}
