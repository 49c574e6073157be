// Package lazysrv is the node's lazy-layer server (decision 3600, S4):
// the process, berth-lazy, that serves every lazy layer's filesystem on
// a FUSE connection berthd mounted (internal/lazy/fuseconn) and the
// node's keeper holds, so that the layers outlive berthd, and a server
// that dies is replaced on the same connections by the next one the
// keeper starts.
//
// A server holds nothing another server would need: each layer is served
// from its layer dir alone (LayerDir), which berthd wrote and keeps, and
// a chunk not on disk is asked of berthd (Ranges), which alone holds the
// registry's credentials (decision 3410). While berthd is away a read of
// such a chunk is retried, then fails with EIO; everything on disk reads
// on.
package lazysrv

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// The files of a lazy layer's dir (layers/<chain> in berthd's root).
const (
	// MetaFile is berthd's description of the layer (Meta).
	MetaFile = "lazy.json"
	// SettingsFile is the mount's FUSE handshake (fuseconn.Settings).
	SettingsFile = "fuse.json"
	// BackingFile records, for the mount's connection, the I/O mode of
	// each file its servers opened and the backing ID of those passed
	// through (fuseconn.Serve's backing): the server writes it.
	BackingFile = "backing"
	// TOCFile is the blob's tail from its TOC's offset: the eStargz TOC
	// and footer, as berthd fetched and verified them. The server checks
	// them again against Meta.TOCDigest.
	TOCFile = "toc.gz"
	// CompleteFile says that the background fetch has the whole blob,
	// verified (Complete).
	CompleteFile = "complete.json"
	// CorruptFile marks a layer whose chunk failed its digest: its
	// images are not kept.
	CorruptFile = "corrupt"
	// CacheDir holds the verified chunks and, once complete, the files.
	CacheDir = "cache"
	// MountDir is the layer's mountpoint.
	MountDir = "diff"
)

// maxMetaFile bounds what a server reads of lazy.json and complete.json.
const maxMetaFile = 16 << 10

// Meta is lazy.json.
type Meta struct {
	// Blob is the layer blob's digest, Size its size (the manifest's).
	Blob string `json:"blob"`
	Size int64  `json:"size"`
	// TOCDigest is the digest of the TOC's JSON (the manifest's
	// annotation).
	TOCDigest string `json:"tocDigest"`
	// Socket is berthd's range socket (Ranges), which a server asks for
	// the chunks it lacks; empty: none (the layer reads what is on disk).
	Socket string `json:"socket,omitempty"`
}

// Complete is complete.json: the blob is in the content store, its
// digest and diff ID checked.
type Complete struct {
	// BlobPath is the verified blob.
	BlobPath string `json:"blobPath"`
	// Unpacked is the size of its decompressed stream: the files the TOC
	// lists may not add up to more.
	Unpacked int64 `json:"unpacked"`
}

// readJSON reads the small JSON file path into v.
func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxMetaFile+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxMetaFile {
		return fmt.Errorf("read %s: larger than %d bytes", path, maxMetaFile)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

// LoadMeta reads dir's lazy.json and checks it.
func LoadMeta(dir string) (*Meta, error) {
	var m Meta
	if err := readJSON(filepath.Join(dir, MetaFile), &m); err != nil {
		return nil, fmt.Errorf("lazy layer %s: %w", dir, err)
	}
	if m.Blob == "" || m.TOCDigest == "" || m.Size <= 0 {
		return nil, fmt.Errorf("lazy layer %s: %s names no blob, size or TOC digest", dir, MetaFile)
	}
	return &m, nil
}

// LoadComplete reads dir's complete.json: nil, nil while there is none.
func LoadComplete(dir string) (*Complete, error) {
	var c Complete
	err := readJSON(filepath.Join(dir, CompleteFile), &c)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lazy layer %s: %w", dir, err)
	}
	if c.BlobPath == "" || c.Unpacked < 0 {
		return nil, fmt.Errorf("lazy layer %s: %s names no blob", dir, CompleteFile)
	}
	return &c, nil
}
