package cri

import (
	"context"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// maxStreamBatchBytes bounds the encoded items of one Stream* response: far
// below gRPC's default 4 MiB receive limit (and the kubelet's 16 MiB), large
// enough that per-message costs stay small. One item larger than this is
// sent alone (every response holds at least one item, KEP-5825).
const maxStreamBatchBytes = 1 << 20

// batcher collects the items of a Stream* RPC and sends them in responses
// of at least one item and about maxStreamBatchBytes; nothing is sent for
// an empty result, so the stream is just EOF. It checks the stream's
// context before each item, so a cancelled or timed-out stream stops the
// work at once.
type batcher[T proto.Message] struct {
	ctx   context.Context
	send  func([]T) error
	items []T
	bytes int
}

func newBatcher[T proto.Message](ctx context.Context, send func([]T) error) *batcher[T] {
	return &batcher[T]{ctx: ctx, send: send}
}

// add queues item, first sending what is queued when item would take the
// batch past the budget.
func (b *batcher[T]) add(item T) error {
	if err := b.ctx.Err(); err != nil {
		return toStatus(err)
	}
	// As a repeated field 1 of the response: tag, length, bytes.
	n := protowire.SizeBytes(proto.Size(item)) + 1
	if len(b.items) > 0 && b.bytes+n > maxStreamBatchBytes {
		if err := b.flush(); err != nil {
			return err
		}
	}
	b.items = append(b.items, item)
	b.bytes += n
	return nil
}

// flush sends what is queued, if anything. gRPC encodes the message
// before Send returns, so the slice is reused.
func (b *batcher[T]) flush() error {
	if len(b.items) == 0 {
		return nil
	}
	if err := b.ctx.Err(); err != nil {
		return toStatus(err)
	}
	if err := b.send(b.items); err != nil {
		return err
	}
	clear(b.items)
	b.items, b.bytes = b.items[:0], 0
	return nil
}
