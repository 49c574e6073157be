package daemon

import (
	"context"
	"os"

	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/shim"
)

// keeperLazyHolder hands the image store's lazy layers to the node's
// keeper, which runs berth-lazy to serve them (decision 3600, S4); the
// node is launched at the first layer when no pod did.
type keeperLazyHolder struct {
	binary   string // berth-shim
	shimsDir string
}

var _ image.LazyHolder = keeperLazyHolder{}

func (h keeperLazyHolder) Hold(ctx context.Context, chainID, layerDir string, conn *os.File) error {
	return shim.HoldLazyLayer(ctx, h.binary, h.shimsDir, chainID, layerDir, conn)
}

func (h keeperLazyHolder) Drop(ctx context.Context, chainID string) error {
	return shim.DropLazyLayer(ctx, h.shimsDir, chainID)
}

func (h keeperLazyHolder) Held(ctx context.Context) ([]string, error) {
	return shim.HeldLazyLayers(ctx, h.shimsDir)
}
