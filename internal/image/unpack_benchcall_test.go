package image

import (
	"context"
	"io"
)

func benchUnpack(r io.Reader, dir string) (int64, error) {
	return Unpack(context.Background(), r, dir, "bench", UnpackOptions{MaxLayerSize: 32 << 30, MaxEntries: 1 << 22, MaxDirs: 1 << 20})
}
