package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/berthcri/berth/internal/errdefs"
)

// The unpacker's entry point for a pull: a layer blob's stream in, an
// overlayfs lower dir out, its diff ID checked (unpack.go does the tar).

// Decompress returns a reader of the tar stream in r, detecting gzip and
// zstd by their magic bytes (uncompressed tars pass through).
func Decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read layer header: %w", err)
	}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("open gzip stream: %w", err)
		}
		return zr, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("open zstd stream: %w", err)
		}
		return zr.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
}

// A layer's decompressed stream is read ahead by up to 2 MiB.
const (
	readAheadChunk = 128 << 10
	readAheadDepth = 16
)

// unpackLayer decompresses the blob stream r into dir and checks the
// uncompressed digest against the diff ID. Decompression (with the
// download and hashing before it) runs ahead of the unpack on its own
// goroutine. The uncompressed stream, tar padding after the end marker
// included, is bounded by opts.MaxLayerSize, and everything stops when
// ctx is cancelled.
func unpackLayer(ctx context.Context, r io.Reader, lr layerMeta, dir string, opts UnpackOptions) error {
	rc, err := Decompress(r)
	if err != nil {
		return fmt.Errorf("layer %s: %w", lr.Digest, err)
	}
	defer rc.Close()
	h := sha256.New()
	ra := newReadAhead(io.TeeReader(rc, h), readAheadChunk, readAheadDepth)
	defer ra.Close()
	n, err := Unpack(ctx, ra, dir, lr.Digest, opts)
	if err != nil {
		return err
	}
	// Tar padding after the end marker still counts for the diff ID, and
	// for the layer's size: a stream of zeros after it is cut too.
	tail := &countingReader{r: ra, n: n, max: opts.MaxLayerSize, layer: lr.Digest}
	if _, err := copyCtx(ctx, io.Discard, tail); err != nil {
		return fmt.Errorf("layer %s: read: %w", lr.Digest, err)
	}
	ra.Close() // the hash is complete once the filler returned
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != lr.DiffID {
		return fmt.Errorf("layer %s: uncompressed digest %s, config says %s: %w", lr.Digest, got, lr.DiffID, errdefs.ErrInvalidArgument)
	}
	return nil
}
