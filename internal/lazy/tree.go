package lazy

import (
	"fmt"
	"slices"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/hanwen/go-fuse/v2/fs"
)

// Tree is l's filesystem as a go-fuse node tree, built when it is added
// to a server: for a server that serves a connection it did not mount
// (internal/lazy/fuseconn, decision 3600 S4). Its inode numbers are fit
// to be its node IDs (fs.Options.ExternalNodeID): the entries' are 2 and
// up, given in the order of names in each directory (1 is the root's node
// ID), the same in every process that opens the layer; its files are
// opened without a handle.
func Tree(l *Layer) (fs.InodeEmbedder, error) {
	rootEnt, ok := l.Lookup("")
	if !ok {
		return nil, fmt.Errorf("lazy layer tree: the TOC has no root")
	}
	l.held.Store(true)
	return &rootNode{node: node{l: l, ent: rootEnt}}, nil
}

// forEachChildSorted calls f for dir's children in the order of their
// names, until f returns false. ForeachChild walks a map: a tree built in
// its order would number its entries (and resolve hard links and name
// clashes) differently in every process, and a server that takes over a
// connection would give the kernel's node IDs to other files.
func forEachChildSorted(dir *estargz.TOCEntry, f func(name string, ent *estargz.TOCEntry) bool) {
	var names []string
	dir.ForeachChild(func(name string, _ *estargz.TOCEntry) bool {
		names = append(names, name)
		return true
	})
	slices.Sort(names)
	for _, name := range names {
		ent, ok := dir.LookupChild(name)
		if ok && !f(name, ent) {
			return
		}
	}
}
