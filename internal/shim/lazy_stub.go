package shim

// TEMPORARY STUB, dropped at merge: the lazyshim branch builds these in
// internal/shim/lazy.go. They exist here only so that berthd's lazy path
// (internal/daemon/lazyholder.go) compiles; failing, they make every lazy
// layer a full pull (decision 3600).

import (
	"context"
	"errors"
	"os"
)

var errLazyNotBuilt = errors.New("lazy layers: not built in this branch")

// HoldLazyLayer hands a lazy layer's FUSE connection to the node's keeper.
func HoldLazyLayer(ctx context.Context, binary, shimsDir, chainID, layerDir string, conn *os.File) error {
	return errLazyNotBuilt
}

// DropLazyLayer tells the node's keeper to let go of a lazy layer.
func DropLazyLayer(ctx context.Context, shimsDir, chainID string) error {
	return errLazyNotBuilt
}

// HeldLazyLayers lists the lazy layers the node's keeper holds.
func HeldLazyLayers(ctx context.Context, shimsDir string) ([]string, error) {
	return nil, errLazyNotBuilt
}
