package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/berthcri/berth/internal/atomicfile"
	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
)

// Auth is registry credentials, as the CRI AuthConfig carries them.
type Auth struct {
	Username      string
	Password      string
	Auth          string // base64 "user:password"
	IdentityToken string
	RegistryToken string
}

func (a *Auth) authenticator() authn.Authenticator {
	if a == nil || *a == (Auth{}) {
		return authn.Anonymous
	}
	return authn.FromConfig(authn.AuthConfig{
		Username: a.Username, Password: a.Password, Auth: a.Auth,
		IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken,
	})
}

func (a *Auth) key() string {
	if a == nil {
		return ""
	}
	h := sha256.Sum256([]byte(a.Username + "\x00" + a.Password + "\x00" + a.Auth + "\x00" + a.IdentityToken + "\x00" + a.RegistryToken))
	return hex.EncodeToString(h[:8])
}

// Pull fetches ref (normalized: busybox → docker.io/library/busybox:latest)
// for linux/GOARCH through the configured mirrors, then the upstream, and
// stores it. Concurrent pulls of one reference share one download. Nothing
// is visible until the image's metadata is written last.
func (s *Store) Pull(ctx context.Context, ref string, auth *Auth) (*Image, error) {
	n, err := ParseReference(ref)
	if err != nil {
		return nil, err
	}
	return s.pulls.Do(ctx, n.String()+"|"+auth.key(), func(ctx context.Context) (*Image, error) {
		start := time.Now()
		img, err := s.pull(ctx, n, auth)
		if err == nil && s.observer != nil {
			s.observer.PullDone(time.Since(start))
		}
		if err != nil {
			// Blobs and layers of a failed pull are garbage now (unless
			// another image or pull uses them).
			s.WaitGC()
		}
		return img, err
	})
}

func (s *Store) pull(ctx context.Context, n Named, auth *Auth) (*Image, error) {
	eps, err := endpoints(s.hostsDir, n.Domain)
	if err != nil {
		return nil, err
	}
	var names []string
	if n.Digest == "" {
		names = append(names, n.TagRef())
	}
	var errs []error
	target := n
	if n.Digest == "" && slices.ContainsFunc(eps, func(e endpoint) bool { return e.pull && !e.resolve }) {
		// Pull-only hosts (untrusted mirrors) may serve content but never
		// map a tag to a digest: resolve first on a trusted host.
		for _, ep := range eps {
			if !ep.resolve {
				continue
			}
			d, err := s.resolve(ctx, ep, n, auth)
			if err == nil {
				target.Digest = d
				break
			}
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, fmt.Errorf("pull %s: %w", n, ctxErr)
			}
			s.log.Warn("resolve on endpoint failed", "image", n.String(), "endpoint", ep.String(), "error", err)
			errs = append(errs, fmt.Errorf("resolve on %s: %w", ep, err))
		}
		if target.Digest == "" {
			return nil, fmt.Errorf("pull %s: %w", n, errors.Join(errs...))
		}
	}
	for _, ep := range eps {
		if !ep.pull || (target.Digest == "" && !ep.resolve) {
			continue
		}
		img, err := s.pullFrom(ctx, ep, target, names, auth)
		if err == nil {
			s.log.Info("image pulled", "image", n.String(), "id", img.ID, "from", ep.String())
			return img, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("pull %s: %w", n, ctxErr)
		}
		s.log.Warn("pull from endpoint failed", "image", n.String(), "endpoint", ep.String(), "error", err)
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("pull %s: no registry host may pull it: %w", n, errdefs.ErrFailedPrecondition)
	}
	return nil, fmt.Errorf("pull %s: %w", n, errors.Join(errs...))
}

// remoteRef is n's reference at endpoint ep, with the options to reach it.
func remoteRef(ctx context.Context, ep endpoint, n Named, auth *Auth) (name.Reference, []remote.Option, error) {
	tr, err := ep.transport()
	if err != nil {
		return nil, nil, err
	}
	var regOpts []name.Option
	if ep.scheme == "http" {
		regOpts = append(regOpts, name.Insecure)
	}
	reg, err := name.NewRegistry(ep.host, regOpts...)
	if err != nil {
		return nil, nil, fmt.Errorf("registry %s: %w", ep.host, errdefs.ErrInvalidArgument)
	}
	repo := reg.Repo(n.Path)
	var gref name.Reference = repo.Tag(n.Tag)
	if n.Digest != "" {
		gref = repo.Digest(n.Digest)
	}
	return gref, []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(tr),
		remote.WithAuth(auth.authenticator()),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
	}, nil
}

// resolve maps n's tag to the digest of what it names (manifest or index).
func (s *Store) resolve(ctx context.Context, ep endpoint, n Named, auth *Auth) (string, error) {
	gref, opts, err := remoteRef(ctx, ep, n, auth)
	if err != nil {
		return "", err
	}
	if desc, err := remote.Head(gref, opts...); err == nil {
		return desc.Digest.String(), nil
	}
	desc, err := remote.Get(gref, opts...)
	if err != nil {
		return "", classify(err)
	}
	return desc.Digest.String(), nil
}

// pullFrom pulls n (by digest when it has one) from one endpoint and
// stores it under names plus repo@digest.
func (s *Store) pullFrom(ctx context.Context, ep endpoint, n Named, names []string, auth *Auth) (*Image, error) {
	gref, opts, err := remoteRef(ctx, ep, n, auth)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(gref, opts...)
	if err != nil {
		return nil, classify(err)
	}
	var img v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, classify(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, classify(err)
		}
		chosen, err := pickManifest(im)
		if err != nil {
			return nil, err
		}
		if img, err = idx.Image(chosen.Digest); err != nil {
			return nil, classify(err)
		}
	} else if img, err = desc.Image(); err != nil {
		return nil, classify(err)
	}
	names = append(slices.Clone(names), n.Repo()+"@"+desc.Digest.String())
	return s.commit(ctx, img, names)
}

// pickManifest chooses linux/GOARCH from an index, or its only image
// manifest when that one does not name a platform. An image that names
// another OS or architecture is never picked: it could not run here.
func pickManifest(im *v1.IndexManifest) (v1.Descriptor, error) {
	var candidates []v1.Descriptor
	var seen []string
	for _, m := range im.Manifests {
		if !m.MediaType.IsImage() {
			continue
		}
		p := m.Platform
		if p == nil || (p.OS == "" && p.Architecture == "") {
			candidates = append(candidates, m)
			continue
		}
		seen = append(seen, p.OS+"/"+p.Architecture)
		if p.OS == "linux" && p.Architecture == runtime.GOARCH {
			if runtime.GOARCH != "arm64" || p.Variant == "" || p.Variant == "v8" {
				return m, nil
			}
		}
	}
	if len(candidates) == 1 && len(seen) == 0 {
		return candidates[0], nil
	}
	return v1.Descriptor{}, fmt.Errorf("no manifest for linux/%s in the image index (it has %v): %w", runtime.GOARCH, seen, errdefs.ErrNotFound)
}

// classify maps registry errors to error kinds.
func classify(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%w: %w", errdefs.ErrUnauthenticated, err)
		case http.StatusNotFound:
			return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
	}
	return err
}

// layerParallelism is how many layers of one image download and unpack at once.
const layerParallelism = 3

// commit stores img's blobs and layers and then its metadata under names
// (repo:tag and repo@digest strings). Used by pulls and imports.
func (s *Store) commit(ctx context.Context, img v1.Image, names []string) (*Image, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, classify(fmt.Errorf("read manifest: %w", err))
	}
	mdigest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("manifest digest: %w", err)
	}
	cfgRaw, err := img.RawConfigFile()
	if err != nil {
		return nil, classify(fmt.Errorf("read config: %w", err))
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("config digest: %w", err)
	}
	var cfg ocispecv1.Image
	if err := json.Unmarshal(cfgRaw, &cfg); err != nil {
		return nil, fmt.Errorf("parse image config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, fmt.Errorf("image is for %s, not linux: %w", cfg.OS, errdefs.ErrFailedPrecondition)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, classify(fmt.Errorf("read layers: %w", err))
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return nil, fmt.Errorf("image has %d layers but its config %d diff IDs: %w", len(layers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	rec := &imageMeta{ID: cdigest.String(), ManifestDigest: mdigest.String(), ConfigDigest: cdigest.String(), config: &cfg}
	rec.Size = uint64(len(cfgRaw))
	keys := []string{mdigest.String(), cdigest.String()}
	var chain string
	for i, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, classify(fmt.Errorf("layer %d digest: %w", i, err))
		}
		size, err := l.Size()
		if err != nil {
			return nil, classify(fmt.Errorf("layer %s size: %w", d, err))
		}
		mt, err := l.MediaType()
		if err != nil {
			return nil, fmt.Errorf("layer %s media type: %w", d, err)
		}
		diffID := cfg.RootFS.DiffIDs[i].String()
		// Digests name files and dirs in the store: only well-formed ones.
		if !digestPattern.MatchString(diffID) || !digestPattern.MatchString(d.String()) {
			return nil, fmt.Errorf("layer %d: digest %q / diff ID %q is not sha256:<64 hex>: %w", i, d, diffID, errdefs.ErrInvalidArgument)
		}
		if i == 0 {
			chain = diffID
		} else {
			sum := sha256.Sum256([]byte(chain + " " + diffID))
			chain = "sha256:" + hex.EncodeToString(sum[:])
		}
		rec.Layers = append(rec.Layers, layerMeta{Digest: d.String(), MediaType: string(mt), Size: size, DiffID: diffID, ChainID: chain})
		rec.Size += uint64(size)
		keys = append(keys, d.String(), chain)
	}

	// Keep GC (a concurrent RemoveImage) off what this pull is writing.
	s.markInUse(keys, 1)
	defer s.markInUse(keys, -1)

	if err := s.writeBlob(mdigest.String(), manifest); err != nil {
		return nil, err
	}
	s.faults.Hit(fault.ImageAfterBlobWrite, "image", cdigest.String())
	if err := s.writeBlob(cdigest.String(), cfgRaw); err != nil {
		return nil, err
	}
	for _, lr := range rec.Layers {
		if !types.MediaType(lr.MediaType).IsDistributable() {
			return nil, fmt.Errorf("layer %s is non-distributable: %w", lr.Digest, errdefs.ErrFailedPrecondition)
		}
	}
	// Each layer unpacks into its own dir, so layers download and unpack
	// in parallel, a few at a time.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(layerParallelism)
	for i, l := range layers {
		lr := rec.Layers[i]
		g.Go(func() error {
			if err := s.ensureBlob(gctx, lr.Digest, l.Compressed); err != nil {
				return classify(err)
			}
			return s.ensureLayer(gctx, lr)
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return s.register(rec, names)
}

// markInUse adds delta to the use count of digests and chain IDs that a
// pull, import or export is working on; GC keeps whatever has a count.
func (s *Store) markInUse(keys []string, delta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		s.inUse[k] += delta
		if s.inUse[k] <= 0 {
			delete(s.inUse, k)
		}
	}
}

// register writes rec with names added, moving tags other images held.
func (s *Store) register(rec *imageMeta, names []string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.images[rec.ID]; ok {
		rec.RepoTags = slices.Clone(old.RepoTags)
		rec.RepoDigests = slices.Clone(old.RepoDigests)
		rec.ManifestDigest, rec.Layers = old.ManifestDigest, old.Layers
	}
	var tags []string
	for _, nm := range names {
		if strings.Contains(nm, "@") {
			if !slices.Contains(rec.RepoDigests, nm) {
				rec.RepoDigests = append(rec.RepoDigests, nm)
			}
		} else {
			tags = append(tags, nm)
			if !slices.Contains(rec.RepoTags, nm) {
				rec.RepoTags = append(rec.RepoTags, nm)
			}
		}
	}
	if err := s.writeMeta(rec); err != nil {
		return nil, fmt.Errorf("write image metadata %s: %w", rec.ID, err)
	}
	s.images[rec.ID] = rec
	for id, other := range s.images {
		if id == rec.ID {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(other.RepoTags), func(t string) bool { return slices.Contains(tags, t) })
		if len(kept) != len(other.RepoTags) {
			other.RepoTags = kept
			if err := s.writeMeta(other); err != nil {
				return nil, fmt.Errorf("untag image %s: %w", other.ID, err)
			}
		}
	}
	return s.toImage(rec), nil
}

func (s *Store) writeBlob(digest string, data []byte) error {
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return fmt.Errorf("blob %s: content has digest %s: %w", digest, got, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(s.blobPath(digest)); err == nil {
		return nil
	}
	if err := atomicfile.Write(s.blobPath(digest), data, 0o600); err != nil {
		return fmt.Errorf("store blob %s: %w", digest, err)
	}
	return nil
}

// ensureBlob downloads a blob once (concurrent callers share the download)
// into ingest/, verifies its digest and moves it into blobs/.
func (s *Store) ensureBlob(ctx context.Context, digest string, open func() (io.ReadCloser, error)) error {
	for attempt := 0; ; attempt++ {
		err := s.fetchBlob(ctx, digest, open)
		// A shared download started by a pull whose callers all left is
		// cancelled; a caller still waiting fetches it again itself.
		if err != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil && attempt == 0 {
			continue
		}
		return err
	}
}

func (s *Store) fetchBlob(ctx context.Context, digest string, open func() (io.ReadCloser, error)) error {
	if _, err := os.Stat(s.blobPath(digest)); err == nil {
		return nil
	}
	_, err := s.blobs.Do(ctx, digest, func(ctx context.Context) (struct{}, error) {
		if _, err := os.Stat(s.blobPath(digest)); err == nil {
			return struct{}{}, nil
		}
		rc, err := open()
		if err != nil {
			return struct{}{}, fmt.Errorf("fetch blob %s: %w", digest, err)
		}
		defer rc.Close()
		tmp := s.path("ingest", "blob-"+strings.TrimPrefix(digest, "sha256:")+"-"+randomHex())
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return struct{}{}, err
		}
		defer os.Remove(tmp)
		h := sha256.New()
		n, err := copyCtx(ctx, io.MultiWriter(f, h), rc)
		if s.observer != nil {
			s.observer.PulledBytes(n)
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return struct{}{}, fmt.Errorf("fetch blob %s: %w", digest, err)
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
			return struct{}{}, fmt.Errorf("blob %s: downloaded content has digest %s: %w", digest, got, errdefs.ErrInvalidArgument)
		}
		if err := os.Rename(tmp, s.blobPath(digest)); err != nil {
			return struct{}{}, fmt.Errorf("store blob %s: %w", digest, err)
		}
		return struct{}{}, nil
	})
	return err
}

// ensureLayer unpacks a stored layer blob once per chain ID: into ingest/
// first, verified against its diff ID, then renamed into layers/.
func (s *Store) ensureLayer(ctx context.Context, lr layerMeta) error {
	if _, err := os.Stat(s.LayerDiffDir(lr.ChainID)); err == nil {
		return nil
	}
	_, err := s.layers.Do(ctx, lr.ChainID, func(ctx context.Context) (struct{}, error) {
		if _, err := os.Stat(s.LayerDiffDir(lr.ChainID)); err == nil {
			return struct{}{}, nil
		}
		tmp := s.path("ingest", "layer-"+strings.TrimPrefix(lr.ChainID, "sha256:")+"-"+randomHex())
		if err := os.MkdirAll(filepath.Join(tmp, "diff"), 0o755); err != nil {
			return struct{}{}, err
		}
		done := false
		defer func() {
			if !done {
				os.RemoveAll(tmp)
			}
		}()
		if err := s.unpackBlob(ctx, lr, filepath.Join(tmp, "diff")); err != nil {
			return struct{}{}, err
		}
		if err := atomicfile.SyncDir(tmp); err != nil {
			return struct{}{}, err
		}
		if err := os.Rename(tmp, s.layerDir(lr.ChainID)); err != nil {
			return struct{}{}, fmt.Errorf("store layer %s: %w", lr.ChainID, err)
		}
		done = true
		s.faults.Hit(fault.ImageMidUnpack, "layer", lr.ChainID)
		return struct{}{}, nil
	})
	return err
}

func (s *Store) unpackBlob(ctx context.Context, lr layerMeta, dir string) error {
	f, err := os.Open(s.blobPath(lr.Digest))
	if err != nil {
		return fmt.Errorf("open layer blob %s: %w", lr.Digest, err)
	}
	defer f.Close()
	rc, err := Decompress(&ctxReader{ctx: ctx, r: f})
	if err != nil {
		return fmt.Errorf("layer %s: %w", lr.Digest, err)
	}
	defer rc.Close()
	h := sha256.New()
	tee := io.TeeReader(rc, h)
	if _, err := Unpack(tee, dir, lr.Digest, s.unpack); err != nil {
		return err
	}
	// Tar padding after the end marker still counts for the diff ID.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return fmt.Errorf("layer %s: read: %w", lr.Digest, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != lr.DiffID {
		return fmt.Errorf("layer %s: uncompressed digest %s, config says %s: %w", lr.Digest, got, lr.DiffID, errdefs.ErrInvalidArgument)
	}
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
