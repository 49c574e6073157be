package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/lazy/lazysrv"
)

// berthd at start (decision 3600, S4): the lazy layers a previous berthd
// mounted were served by the node's keeper's berth-lazy, not by it, so
// the ones still served are taken up again (reattached): berthd answers
// their range requests again, once it has rebuilt their registry access
// from the image's reference and the node's configuration (the
// credentials a kubelet's PullImage brought died with the old berthd:
// until a new pull of the image, a registry that needs them answers
// errors, and reads of missing chunks fail with EIO as for a registry
// gone), and starts their background fetch again. Anything else (a dead
// mount, no keeper, a corrupt mark, a dir the server cannot read) is
// dropped as before S4: detached, trashed, its images removed (the
// kubelet pulls them again).

// heldTimeout bounds the question to the node's keeper at start.
const heldTimeout = 10 * time.Second

// fuseSuperMagic is statfs's f_type of a FUSE mount.
const fuseSuperMagic = 0x65735546

// lazyAtStart reattaches or drops every lazy layer on disk.
func (s *Store) lazyAtStart() error {
	es, err := s.layers.list()
	if err != nil {
		return err
	}
	var held map[string]bool
	dropped := map[string]bool{}
	for _, e := range es {
		chainID := "sha256:" + e.Name()
		dir := s.layers.layerDir(chainID)
		if _, err := os.Stat(filepath.Join(dir, lazysrv.MetaFile)); err != nil {
			continue
		}
		if held == nil {
			held = s.heldLazyLayers()
		}
		why := s.reattachable(chainID, dir, held)
		if why == "" {
			s.reattach(chainID, dir)
			continue
		}
		s.log.Warn("lazy layer left by a previous berthd dropped", "layer", chainID, "reason", why)
		if err := s.dropAtStart(chainID, held[chainID]); err != nil {
			return err
		}
		dropped[chainID] = true
	}
	if len(dropped) == 0 {
		return nil
	}
	return s.removeImagesOf(dropped, func(id string) {
		s.log.Warn("image with a lazy layer that could not be kept removed; it is pulled again when needed", "image", id)
	})
}

// heldLazyLayers asks the holder which layers it holds: none when there
// is no holder or it cannot say (every lazy layer is then dropped).
func (s *Store) heldLazyLayers() map[string]bool {
	held := map[string]bool{}
	if s.lazy.holder == nil || s.lazySock == "" {
		return held
	}
	ctx, cancel := context.WithTimeout(context.Background(), heldTimeout)
	defer cancel()
	ids, err := s.lazy.holder.Held(ctx)
	if err != nil {
		s.log.Warn("lazy layers: the node's keeper cannot say which it holds; dropping them", "error", err)
		return held
	}
	for _, id := range ids {
		held[id] = true
	}
	return held
}

// reattachable says why the lazy layer chainID cannot be taken up again,
// or "" when it can.
func (s *Store) reattachable(chainID, dir string, held map[string]bool) string {
	if why, ok := corruptMark(dir); ok {
		// Found by a server while berthd was away: counted now.
		s.lazy.corrupt.Add(1)
		return "marked corrupt: " + why
	}
	if !held[chainID] {
		return "the node's keeper does not hold it"
	}
	for _, f := range []string{lazysrv.SettingsFile, lazysrv.TOCFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Sprintf("no %s: %v", f, err)
		}
	}
	if _, err := s.lazyLayerMeta(chainID); err != nil {
		return err.Error()
	}
	return mountAnswers(filepath.Join(dir, lazysrv.MountDir), mountAnswerTimeout)
}

// mountAnswerTimeout bounds the look at a lazy layer's mount at start: a
// server that hangs must not hold berthd's start.
const mountAnswerTimeout = 10 * time.Second

// mountAnswers says why the FUSE mount at dir is not served, or "" when
// it is: statfs names FUSE and a stat of its root is answered within
// timeout. (A server restarting makes the stat wait for it; one given up
// on has had its connection aborted: ENOTCONN or ECONNABORTED.) A look
// that times out leaves its goroutine waiting for the server, which the
// drop that follows (detaching the mount) does not end: one per layer at
// most, until the keeper's server answers or dies.
func mountAnswers(dir string, timeout time.Duration) string {
	answer := make(chan string, 1)
	go func() {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			answer <- fmt.Sprintf("statfs of its mount: %v", err)
			return
		}
		if fs.Type != fuseSuperMagic {
			answer <- "not mounted"
			return
		}
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			answer <- fmt.Sprintf("its mount does not answer: %v", err)
			return
		}
		answer <- ""
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case why := <-answer:
		return why
	case <-t.C:
		return fmt.Sprintf("its mount did not answer in %v", timeout)
	}
}

// lazyLayerMeta is the layer chainID as an image record names it.
func (s *Store) lazyLayerMeta(chainID string) (layerMeta, error) {
	var lr layerMeta
	var found bool
	s.index.view(func(images map[string]*imageMeta) {
		for _, meta := range images {
			for _, l := range meta.Layers {
				if l.ChainID == chainID && l.TOCDigest != "" {
					lr, found = l, true
					return
				}
			}
		}
	})
	if !found {
		return lr, errors.New("no image uses it")
	}
	return lr, nil
}

// dropAtStart detaches the lazy layer chainID, lets the holder go of it
// if it holds it, and trashes its dir.
func (s *Store) dropAtStart(chainID string, held bool) error {
	diff := s.layers.diffDir(chainID)
	if err := unix.Unmount(diff, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		s.log.Warn("lazy layer left by a previous berthd: unmount", "layer", chainID, "error", err)
	}
	if held {
		s.lazy.drop(chainID)
	}
	hexName := filepath.Base(s.layers.layerDir(chainID))
	if err := s.layers.trash(hexName); err != nil {
		return fmt.Errorf("remove lazy layer %s left by a previous berthd: %w", chainID, err)
	}
	return nil
}

// reattach takes up the lazy layer chainID that the keeper still holds
// and serves: its range answers and its background fetch, once its
// registry access is rebuilt (in the background: berthd's start does not
// wait for a registry).
func (s *Store) reattach(chainID, dir string) {
	lr, _ := s.lazyLayerMeta(chainID)
	e := &lazyEntry{dir: dir, mount: filepath.Join(dir, lazysrv.MountDir)}
	s.startLazy(chainID, e, func(ctx context.Context, e *lazyEntry) {
		rb, ok := s.registryAgain(ctx, lr)
		if !ok {
			return
		}
		s.lazy.setSource(chainID, rangeSource(&registrySource{c: rb.c, digest: lr.Digest, size: lr.Size}, rb))
		s.backgroundFetch(ctx, lr, rb, e)
	})
	s.log.Info("lazy layer of a previous berthd taken up", "layer", chainID)
}

// registryAgain rebuilds the registry access of lr from the reference of
// an image that uses it, with the node's configuration and no
// credentials of a pull, retried with back-off until it works or ctx
// ends.
func (s *Store) registryAgain(ctx context.Context, lr layerMeta) (registryBlobs, bool) {
	delay := backgroundRetryFirst
	for {
		rb, err := s.registryOf(ctx, lr)
		if err == nil {
			return rb, true
		}
		s.log.Warn("lazy layer: rebuild its registry access, retrying", "layer", lr.ChainID, "in", delay, "error", err)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return registryBlobs{}, false
		}
		delay = min(2*delay, backgroundRetryMax)
	}
}

// registryOf is the registry access to lr's blob through the first
// endpoint that may pull the repository of an image that uses it.
func (s *Store) registryOf(ctx context.Context, lr layerMeta) (registryBlobs, error) {
	var refs []string
	s.index.view(func(images map[string]*imageMeta) {
		for _, meta := range images {
			for _, l := range meta.Layers {
				if l.ChainID == lr.ChainID {
					refs = append(refs, meta.RepoDigests...)
					break
				}
			}
		}
	})
	set := s.settings()
	var errs []error
	for _, ref := range refs {
		n, err := ParseReference(ref)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		eps, err := endpoints(set.RegistryConfigDir, n.Domain)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, ep := range eps {
			if !ep.pull {
				continue
			}
			rc, err := remoteRef(ctx, ep, n, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", ep, err))
				continue
			}
			return registryBlobs{c: rc, set: set.RangeFetch, lazy: true, lazyTimeout: lazyTimeoutOf(set), lazyQuiet: set.LazyBackgroundQuiet}, nil
		}
	}
	if len(errs) == 0 {
		return registryBlobs{}, errors.New("no image reference names a registry that may be pulled from")
	}
	return registryBlobs{}, errors.Join(errs...)
}
