package lazysrv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy"
	"github.com/berthcri/berth/internal/lazy/fuseconn"
	"github.com/berthcri/berth/internal/shim/proto"
)

// Options shape a server.
type Options struct {
	Log *slog.Logger
	// Retries and RetryDelay bound a read of a chunk that is not on disk
	// while berthd does not answer: asked again Retries times, from
	// RetryDelay doubling, then EIO.
	Retries    int
	RetryDelay time.Duration
	// RequestTimeout bounds one ask of berthd.
	RequestTimeout time.Duration
	// CompletePoll is how often a layer's dir is looked at for
	// complete.json.
	CompletePoll time.Duration
}

// DefaultOptions: a missing chunk waits about a minute for berthd
// (0.25 s doubling, 8 retries) before EIO.
func DefaultOptions(log *slog.Logger) Options {
	return Options{Log: log, Retries: 8, RetryDelay: 250 * time.Millisecond, RequestTimeout: time.Minute, CompletePoll: time.Second}
}

// Server serves lazy layers, each on the connection it is handed.
type Server struct {
	opts   Options
	mu     sync.Mutex
	layers map[string]*served
	// writeOut lets one layer at a time write its files out: each write
	// takes a scratch buffer of up to 4 MiB, and sixteen layers
	// completing together held 26–30 MiB (docs/images.md); one at a
	// time, and the heap returned after each, the server stays small.
	// The disk is the bound either way.
	writeOut chan struct{}
}

type served struct {
	src  *source
	l    *lazy.Layer
	srv  *fuseconn.Server
	stop context.CancelFunc
	done chan struct{} // closed when the completion watch ended
}

// New returns a server that serves nothing yet.
func New(opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.CompletePoll <= 0 {
		opts.CompletePoll = time.Second
	}
	return &Server{opts: opts, layers: map[string]*served{}, writeOut: make(chan struct{}, 1)}
}

// Add serves the layer id, whose dir is dir, on dev (a connection that
// fuseconn.Mount made; the server keeps its own copy, the caller may
// close dev). It takes the connection over: the requests a previous
// server read and left are answered (fuseconn.Serve).
func (s *Server) Add(ctx context.Context, id, dir string, dev *os.File) error {
	s.mu.Lock()
	_, dup := s.layers[id]
	s.mu.Unlock()
	if dup {
		return fmt.Errorf("lazy layer %s: served already", id)
	}
	meta, err := LoadMeta(dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, CorruptFile)); err == nil {
		return fmt.Errorf("lazy layer %s: marked corrupt", id)
	}
	settings, err := fuseconn.Load(filepath.Join(dir, SettingsFile))
	if err != nil {
		return fmt.Errorf("lazy layer %s: %w", id, err)
	}
	src, err := openSource(id, dir, meta)
	if err != nil {
		return err
	}
	log := s.opts.Log.With("layer", id)
	l, err := lazy.Open(ctx, src, meta.TOCDigest, lazy.Options{
		CacheDir:       filepath.Join(dir, CacheDir),
		Log:            log,
		OnCorrupt:      func(err error) { markCorrupt(dir, log, err) },
		Retries:        s.opts.Retries,
		RetryDelay:     s.opts.RetryDelay,
		RequestTimeout: s.opts.RequestTimeout,
	})
	if err != nil {
		src.close()
		return fmt.Errorf("lazy layer %s: %w", id, err)
	}
	e := &served{src: src, l: l, done: make(chan struct{})}
	// A complete layer's files, if written already, are used before the
	// first request: its reads need nobody. Writing them is left to the
	// watch, so that no layer waits to be served behind another's
	// write-out.
	s.useComplete(ctx, dir, e, log, false)
	root, err := lazy.Tree(l)
	if err != nil {
		l.Close()
		src.close()
		return err
	}
	if e.srv, err = fuseconn.Serve(dev, settings, root, lazy.HeldOptions(), filepath.Join(dir, BackingFile)); err != nil {
		l.Close()
		src.close()
		return fmt.Errorf("lazy layer %s: %w", id, err)
	}
	bg, stop := context.WithCancel(context.Background())
	e.stop = stop
	s.mu.Lock()
	s.layers[id] = e
	s.mu.Unlock()
	go func() {
		defer close(e.done)
		s.watchComplete(bg, dir, e, log)
	}()
	log.Info("lazy layer served", "dir", dir, "resend", settings.CanResend(), "local", l.Local(), "files", l.LocalFiles())
	return nil
}

// watchComplete waits for complete.json, then has the layer read its
// blob and write its files out.
func (s *Server) watchComplete(ctx context.Context, dir string, e *served, log *slog.Logger) {
	t := time.NewTicker(s.opts.CompletePoll)
	defer t.Stop()
	for !e.l.LocalFiles() && !e.l.Corrupt() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.useComplete(ctx, dir, e, log, true)
	}
}

// useComplete switches the layer to its local blob and files once
// berthd said it is complete, writing the files out if writeOut and they
// are not there yet; a failure leaves it reading as before.
func (s *Server) useComplete(ctx context.Context, dir string, e *served, log *slog.Logger, writeOut bool) {
	if e.l.LocalFiles() {
		return
	}
	c, err := LoadComplete(dir)
	if err != nil {
		log.Warn("lazy layer: completion", "error", err)
		return
	}
	if c == nil {
		return
	}
	if !e.l.Local() {
		f, err := os.Open(c.BlobPath)
		if err != nil {
			log.Warn("lazy layer: open its complete blob", "error", err)
			return
		}
		e.l.UseLocal(f)
	}
	if e.l.UseWrittenFiles() {
		log.Info("lazy layer files local")
		return
	}
	if !writeOut {
		return
	}
	select {
	case s.writeOut <- struct{}{}:
	case <-ctx.Done():
		return
	}
	err = e.l.Materialize(ctx, c.Unpacked)
	// The write-out's buffers are garbage now; a server that idles
	// for days should not keep them.
	debug.FreeOSMemory()
	<-s.writeOut
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("lazy layer: write its files out; reads go on from its blob", "error", err)
		}
		return
	}
	log.Info("lazy layer files local")
}

// abort ends the connection of a layer no server can serve (its dir is
// not what berthd wrote), so that its readers get an error (ECONNABORTED)
// instead of
// waiting for ever: a forced unmount aborts a FUSE connection before
// anything else (the keeper's copy of the fd cannot keep it), and berthd
// drops the layer at its next look. The unmount itself may fail (an
// overlay still has the layer as a lower dir).
func abort(dir string, log *slog.Logger) {
	mnt := filepath.Join(dir, MountDir)
	if err := unix.Unmount(mnt, unix.MNT_FORCE); err != nil && !errors.Is(err, unix.EBUSY) {
		log.Error("abort lazy layer's connection", "dir", mnt, "error", err)
	}
}

// markCorrupt leaves the mark berthd looks for: the layer's images are
// not kept (decision 3600, S2).
func markCorrupt(dir string, log *slog.Logger, cause error) {
	if err := os.WriteFile(filepath.Join(dir, CorruptFile), []byte(cause.Error()+"\n"), 0o600); err != nil {
		log.Error("lazy layer: mark corrupt", "error", err)
	}
}

// Drop stops serving the layer id: the connection ends when berthd
// unmounts it and nothing uses it any more.
func (s *Server) Drop(id string) {
	s.mu.Lock()
	e := s.layers[id]
	delete(s.layers, id)
	s.mu.Unlock()
	if e == nil {
		return
	}
	e.stop()
	<-e.done
	// The go-fuse server ends with the connection; the layer's files are
	// closed once it does.
	go func() {
		e.srv.Wait()
		e.l.Close()
		e.src.close()
	}()
}

// Count is how many layers are served.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.layers)
}

// Run serves the keeper's link (fd link, the keeper's message codec):
// every lazy-hold adds a layer on the fd it carries, every lazy-drop drops
// one. It returns when the link ends (the keeper is gone: the
// connections go with the processes that hold them).
func (s *Server) Run(ctx context.Context, link int) error {
	r := proto.NewKeeperReader(link)
	for {
		m, fds, err := r.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("keeper link: %w", err)
		}
		switch m.Op {
		case proto.KeeperLazyHold:
			if len(fds) != 1 || m.ID == "" || m.Dir == "" {
				s.opts.Log.Warn("keeper link: bad lazy-hold", "layer", m.ID, "fds", len(fds))
				break
			}
			dev := os.NewFile(uintptr(fds[0]), "/dev/fuse")
			if err := s.Add(ctx, m.ID, m.Dir, dev); err != nil {
				s.opts.Log.Error("serve lazy layer; aborting its connection", "layer", m.ID, "error", err)
				abort(m.Dir, s.opts.Log.With("layer", m.ID))
			}
			dev.Close()
			fds = nil
		case proto.KeeperLazyDrop:
			s.Drop(m.ID)
		case proto.KeeperAdopted:
		default:
			s.opts.Log.Warn("keeper link: unknown message", "op", m.Op)
		}
		proto.CloseFds(fds)
	}
}
