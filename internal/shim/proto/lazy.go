package proto

import (
	"fmt"
	"path/filepath"
)

// Lazy layers held by the node's keeper (decision 3600, S4): what berthd
// and the monitor agree on for OpLazyHold, OpLazyDrop and OpLazyList.

// LazyServerBinary is the lazy-layer server's file name, beside
// berth-shim: the keeper starts it from there.
const LazyServerBinary = "berth-lazy"

// MaxLazyLayers bounds the layers one node holds: each is an fd in the
// keeper for as long as it lives, and a line of every new monitor's
// adopt list. Far above what a node's images have (a few hundred layers
// on a busy node), far below the keeper's fd limit.
const MaxLazyLayers = 4096

// maxLayerDir bounds a layer dir's length (PATH_MAX).
const maxLayerDir = 4096

// CheckChainID checks a chain ID's form, the image store's:
// "sha256:" and 64 lowercase hex digits.
func CheckChainID(id string) error {
	const prefix = "sha256:"
	ok := len(id) == len(prefix)+64 && id[:len(prefix)] == prefix
	for i := len(prefix); ok && i < len(id); i++ {
		c := id[i]
		ok = c >= '0' && c <= '9' || c >= 'a' && c <= 'f'
	}
	if !ok {
		return fmt.Errorf("chain ID %.80q is not sha256:<64 lowercase hex>", id)
	}
	return nil
}

// CheckLayerDir checks a lazy layer's dir: absolute and clean (the
// keeper hands it as is to the server, which serves the files in it),
// at most PATH_MAX long.
func CheckLayerDir(dir string) error {
	if len(dir) > maxLayerDir || !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || dir == "/" {
		return fmt.Errorf("layer dir %.200q is not an absolute, clean path below / of at most %d bytes", dir, maxLayerDir)
	}
	return nil
}
