package fuseconn

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"os"
	"sync"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Passthrough across servers (decision 3600, "Passthrough across
// servers"). The kernel keeps a passthrough open's backing file on the
// FUSE inode for as long as any passthrough open of it lives, and the
// backing IDs servers registered (FUSE_DEV_IOC_BACKING_OPEN) in the
// connection until BACKING_CLOSE or the connection's end, whatever
// became of the server that registered them. An open of such an inode
// answered with another backing ID is refused (EBUSY), one answered in
// cached mode too (EINVAL), both EIO to the caller; so is a passthrough
// open of an inode open in cached mode (ETXTBSY). So the I/O mode of
// each inode is kept with the connection, in a file of records beside
// its settings that every server of it appends to and reads at its
// start:
//   - a node ID's first passthrough open registers the node's file
//     (BackingFiler) and records the backing ID before the open is
//     answered; that ID is never closed (the kernel drops them all with
//     the connection), and every later open of the node, by any server,
//     is answered in passthrough with it;
//   - a node's cached-mode open is recorded too: a server that finds such
//     a record of another server cannot know whether that open lives, so
//     it answers every open of the node in cached mode (the node serves
//     the reads).
//
// A node's file is held by the kernel for the connection's life once
// registered: at most one per regular file of the tree.

// BackingFiler is a node of a served tree whose opens may be passed
// through to a local file: its Open asks for it with FOPEN_PASSTHROUGH
// (and returns a handle whose reads serve the same bytes, for the opens
// that the kernel or the records keep in cached mode). BackingFile opens
// the file to register; the kernel keeps its own reference, the caller
// closes it.
type BackingFiler interface {
	BackingFile() (*os.File, error)
}

const (
	backingMagic  = "berth-backing-1\n"
	backingHeader = len(backingMagic) + 16 // the magic, the connection's ID
	backingRecord = 16                     // node ID, backing ID (0: cached), CRC-32C
	// MaxBackingFiles bounds the backing files a connection holds in the
	// kernel (a file and its path each): past it, opens of files not yet
	// passed through are answered in cached mode. A layer's files are
	// bounded only by its TOC's size (64 MiB of JSON), and one container
	// that opens each of them once would otherwise pin them all.
	MaxBackingFiles = 1 << 16
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// newConnID is a connection's ID (Settings.Conn).
func newConnID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("connection ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// backing is a served connection's table of backing files.
type backing struct {
	srv   *fuse.Server
	files map[uint64]*fs.Inode // the tree's regular files, by node ID
	log   *log.Logger

	mu  sync.Mutex
	out *os.File // the records, appended to; nil: passthrough off
	// ids is each recorded node's backing ID, 0 for a cached-mode open.
	ids map[uint64]int32
	// stayCached are the nodes this server answers in cached mode only
	// (unless a backing ID is recorded): those a previous server recorded
	// in cached mode, whose opens may live, and those whose file could
	// not be opened for registration, which this server opened so.
	stayCached map[uint64]bool
	refused    bool // the kernel refused a backing file: passthrough off
	held       int  // backing IDs recorded (MaxBackingFiles)
}

// openBacking reads the records at path for the connection conn, whose
// tree's regular files are files, or starts them (a file of another
// connection is begun again). conn "" (a mount made before connections
// had IDs) turns passthrough off.
func openBacking(path, conn string, files map[uint64]*fs.Inode, srv *fuse.Server, logger *log.Logger) (*backing, error) {
	b := &backing{srv: srv, files: files, log: logger, ids: map[uint64]int32{}, stayCached: map[uint64]bool{}}
	if conn == "" {
		return b, nil
	}
	id, err := hex.DecodeString(conn)
	if err != nil || len(id) != 16 {
		return nil, fmt.Errorf("backing records: connection ID %q", conn)
	}
	header := append([]byte(backingMagic), id...)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("backing records: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
		}
	}()
	// Every regular file may have a cached record and a backing one.
	limit := int64(backingHeader + 2*backingRecord*len(files))
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("backing records %s: %w", path, err)
	}
	if len(data) < backingHeader || !bytes.Equal(data[:backingHeader], header) {
		// Empty, or another connection's (the layer was mounted again):
		// none of it is this connection's.
		if err := f.Truncate(0); err != nil {
			return nil, fmt.Errorf("backing records %s: %w", path, err)
		}
		if _, err := f.Write(header); err != nil {
			return nil, fmt.Errorf("backing records %s: %w", path, err)
		}
		b.out, ok = f, true
		return b, nil
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("backing records %s: more than %d bytes for %d files", path, limit, len(files))
	}
	recs := data[backingHeader:]
	if len(recs)%backingRecord != 0 {
		return nil, fmt.Errorf("backing records %s: %d bytes of records", path, len(recs))
	}
	for i := 0; i < len(recs); i += backingRecord {
		node, bid, err := decodeRecord(recs[i : i+backingRecord])
		if err != nil {
			return nil, fmt.Errorf("backing records %s: record %d: %w", path, i/backingRecord, err)
		}
		if _, ok := files[node]; !ok {
			return nil, fmt.Errorf("backing records %s: node %d is not a regular file of the tree", path, node)
		}
		old, seen := b.ids[node]
		switch {
		case bid == 0:
			b.stayCached[node] = true
			if !seen {
				b.ids[node] = 0
			}
		case seen && old != 0 && old != bid:
			return nil, fmt.Errorf("backing records %s: node %d has backing IDs %d and %d", path, node, old, bid)
		case !seen || old == 0:
			b.ids[node] = bid
			b.held++
		}
	}
	b.out, ok = f, true
	return b, nil
}

func encodeRecord(node uint64, id int32) []byte {
	rec := make([]byte, backingRecord)
	binary.LittleEndian.PutUint64(rec[0:], node)
	binary.LittleEndian.PutUint32(rec[8:], uint32(id))
	binary.LittleEndian.PutUint32(rec[12:], crc32.Checksum(rec[:12], crcTable))
	return rec
}

func decodeRecord(rec []byte) (node uint64, id int32, err error) {
	if crc32.Checksum(rec[:12], crcTable) != binary.LittleEndian.Uint32(rec[12:]) {
		return 0, 0, errors.New("checksum mismatch")
	}
	node, id = binary.LittleEndian.Uint64(rec[0:]), int32(binary.LittleEndian.Uint32(rec[8:]))
	if id < 0 {
		return 0, 0, fmt.Errorf("backing ID %d", id)
	}
	return node, id, nil
}

// record appends node's record; the caller holds mu.
func (b *backing) record(node uint64, id int32) error {
	if _, err := b.out.Write(encodeRecord(node, id)); err != nil {
		return fmt.Errorf("record the I/O mode of node %d: %w", node, err)
	}
	b.ids[node] = id
	return nil
}

// open settles the I/O mode of an open of node that the tree answered
// with out, before the kernel gets it (see the comment at the top).
func (b *backing) open(node uint64, out *fuse.OpenOut) error {
	inode, ok := b.files[node]
	if !ok || b.out == nil {
		// Not a regular file of the tree, or no records: no passthrough.
		out.OpenFlags &^= fuse.FOPEN_PASSTHROUGH
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	id, known := b.ids[node]
	if known && id != 0 {
		passthrough(out, id)
		return nil
	}
	// cached answers the open in cached mode, recorded so.
	cached := func() error {
		out.OpenFlags &^= fuse.FOPEN_PASSTHROUGH
		if known {
			return nil
		}
		return b.record(node, 0)
	}
	switch {
	case out.OpenFlags&fuse.FOPEN_PASSTHROUGH == 0:
		if out.OpenFlags&fuse.FOPEN_DIRECT_IO != 0 {
			return nil // no I/O mode taken
		}
		return cached()
	case b.refused || b.stayCached[node] || b.held >= MaxBackingFiles:
		return cached()
	}
	bf, ok := inode.Operations().(BackingFiler)
	if !ok {
		b.stayCached[node] = true
		return cached()
	}
	f, err := bf.BackingFile()
	if err != nil {
		// The tree's handle serves the reads; this server keeps the node
		// in cached mode (that open may live on).
		b.log.Printf("open the backing file of node %d: %v: opened in cached mode", node, err)
		b.stayCached[node] = true
		return cached()
	}
	id, errno := b.srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
	f.Close()
	if errno != 0 {
		// No CAP_SYS_ADMIN, the file on a stacked filesystem (ELOOP):
		// the tree serves the reads, for this server's life.
		b.refused = true
		b.log.Printf("FUSE passthrough refused by the kernel (%v): reads go through the server", errno)
		return cached()
	}
	if err := b.record(node, id); err != nil {
		if errno := b.srv.UnregisterBackingFd(id); errno != 0 {
			err = errors.Join(err, fmt.Errorf("close backing ID %d: %w", id, errno))
		}
		return err
	}
	b.held++
	passthrough(out, id)
	return nil
}

// passthrough makes out an open passed through to the backing file id:
// the kernel refuses FOPEN_KEEP_CACHE with it (the inode's page cache is
// not used).
func passthrough(out *fuse.OpenOut, id int32) {
	out.BackingID = id
	out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
	out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
}

func (b *backing) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.out != nil {
		b.out.Close()
		b.out = nil
	}
}
