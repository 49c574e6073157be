package image

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// layerStore holds the unpacked layers, one per chain ID in
// layers/<chain-hex>/diff, each an overlayfs lower dir: containerd's
// snapshots, reduced to committed read-only ones. A layer is unpacked into
// a dir in ingest/ (prepare) and renamed into place whole (commit), so a
// layer under layers/ is always complete; the collector renames unused
// ones into trash/ and deletes them there.
//
// Like the content store it has no lock: each change is one rename.
type layerStore struct {
	dir string // the store root, <berth root>/images
}

func (l *layerStore) path(elem ...string) string {
	return filepath.Join(append([]string{l.dir}, elem...)...)
}

func (l *layerStore) layerDir(chainID string) string {
	return l.path("layers", strings.TrimPrefix(chainID, "sha256:"))
}

// diffDir is the unpacked content of a layer, an overlayfs lower dir.
func (l *layerStore) diffDir(chainID string) string {
	return filepath.Join(l.layerDir(chainID), "diff")
}

// has reports whether the layer is unpacked.
func (l *layerStore) has(chainID string) bool {
	_, err := os.Stat(l.diffDir(chainID))
	return err == nil
}

// list is every unpacked layer, by chain hex.
func (l *layerStore) list() ([]os.DirEntry, error) {
	es, err := os.ReadDir(l.path("layers"))
	if err != nil {
		return nil, fmt.Errorf("read image layers: %w", err)
	}
	return es, nil
}

// layerTx is a layer being unpacked: a dir in ingest/ that commit moves
// into layers/ and abort removes.
type layerTx struct {
	l       *layerStore
	chainID string
	path    string
	done    bool
}

// prepare makes an empty layer dir in ingest/ for chainID.
func (l *layerStore) prepare(chainID string) (*layerTx, error) {
	p := l.path("ingest", "layer-"+strings.TrimPrefix(chainID, "sha256:")+"-"+randomHex())
	if err := os.MkdirAll(filepath.Join(p, "diff"), 0o755); err != nil {
		return nil, err
	}
	return &layerTx{l: l, chainID: chainID, path: p}, nil
}

// diffDir is where the layer's files go.
func (t *layerTx) diffDir() string { return filepath.Join(t.path, "diff") }

func (t *layerTx) commit() error {
	if err := os.Rename(t.path, t.l.layerDir(t.chainID)); err != nil {
		return fmt.Errorf("store layer %s: %w", t.chainID, err)
	}
	t.done = true
	return nil
}

// abort removes the half-unpacked layer, unless it was committed.
func (t *layerTx) abort() {
	if !t.done {
		t.done = true
		os.RemoveAll(t.path)
	}
}

// trash moves the layer named by chain hex into trash/, out of every
// lookup; emptyTrash deletes it later, without any lock held.
func (l *layerStore) trash(hexName string) error {
	return os.Rename(l.path("layers", hexName), l.path("trash", hexName+"."+randomHex()))
}

// emptyTrash deletes the layer trees trash moved there. What a crash
// midway leaves Open deletes.
func (l *layerStore) emptyTrash(log *slog.Logger) {
	es, err := os.ReadDir(l.path("trash"))
	if err != nil {
		log.Warn("read image trash", "error", err)
		return
	}
	for _, e := range es {
		if err := os.RemoveAll(l.path("trash", e.Name())); err != nil {
			log.Warn("delete unused layer", "path", e.Name(), "error", err)
		}
	}
}
