package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispecv1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/tracing"
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
		// Read once: the pull finishes on the settings it started with,
		// whatever a reload changes meanwhile.
		set := s.settings()
		ctx, w, stop := s.watch(ctx, set.ProgressTimeout)
		img, err := s.pull(ctx, n, auth, w, set)
		stop()
		err = w.stalledError(ctx, n.String(), err)
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

func (s *Store) pull(ctx context.Context, n Named, auth *Auth, w *pullWatch, set PullSettings) (*Image, error) {
	policy := set.SignaturePolicy
	if policy != nil {
		if err := policy.Precheck(n); err != nil {
			return nil, fmt.Errorf("pull %s: %w", n, err)
		}
	}
	eps, err := endpoints(set.RegistryConfigDir, n.Domain)
	if err != nil {
		return nil, err
	}
	var names []string
	if n.Digest == "" {
		names = append(names, n.TagRef())
	}
	var errs []error
	var refused *SignatureError
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
		img, err := s.pullFrom(ctx, ep, target, n, names, auth, w, policy)
		if err == nil {
			s.log.Info("image pulled", "image", n.String(), "id", img.ID, "from", ep.String())
			return img, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("pull %s: %w", n, ctxErr)
		}
		s.log.Warn("pull from endpoint failed", "image", n.String(), "endpoint", ep.String(), "error", err)
		if se, ok := AsSignatureError(err); ok && refused == nil {
			refused = se
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	if refused != nil {
		// The policy's verdict is the answer, whatever the other hosts
		// said (each is in the log above).
		return nil, fmt.Errorf("pull %s: %w", n, refused)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("pull %s: no registry host may pull it: %w", n, errdefs.ErrFailedPrecondition)
	}
	return nil, fmt.Errorf("pull %s: %w", n, errors.Join(errs...))
}

// repoClient reaches one repository on one endpoint: the reference and
// options for go-containerregistry (manifests, configs) and an HTTP client
// with the endpoint's TLS, headers and registry auth for layer blobs, which
// berth streams itself.
type repoClient struct {
	repo    name.Repository
	ref     name.Reference
	opts    []remote.Option
	http    *http.Client
	blobURL string // scheme://host/v2/<repo>/blobs/
}

// remoteRef is n's repository at endpoint ep. It talks to the registry
// once (the API ping that finds the auth scheme).
func remoteRef(ctx context.Context, ep endpoint, n Named, auth *Auth) (*repoClient, error) {
	tr, err := ep.transport()
	if err != nil {
		return nil, err
	}
	var regOpts []name.Option
	if ep.scheme == "http" {
		regOpts = append(regOpts, name.Insecure)
	}
	reg, err := name.NewRegistry(ep.host, regOpts...)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", ep.host, errdefs.ErrInvalidArgument)
	}
	repo := reg.Repo(n.Path)
	var gref name.Reference = repo.Tag(n.Tag)
	if n.Digest != "" {
		gref = repo.Digest(n.Digest)
	}
	// Wrapped once here (retries, user agent, auth) so that manifest and
	// blob requests share one token.
	inner := transport.NewUserAgent(transport.NewRetry(tr), "berth")
	authed, err := transport.NewWithContext(ctx, reg, auth.authenticator(), inner, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, classify(err)
	}
	return &repoClient{
		repo: repo,
		ref:  gref,
		opts: []remote.Option{
			remote.WithContext(ctx),
			remote.WithTransport(authed),
			remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		},
		http:    &http.Client{Transport: authed},
		blobURL: fmt.Sprintf("%s://%s/v2/%s/blobs/", reg.Scheme(), reg.RegistryStr(), repo.RepositoryStr()),
	}, nil
}

// openBlob starts the download of a blob; the body is read as it arrives
// and checked by the caller. ctx bounds the whole download.
func (c *repoClient) openBlob(ctx context.Context, digest string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.blobURL+digest, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		resp.Body.Close()
		return nil, classify(err)
	}
	return resp.Body, nil
}

// resolve maps n's tag to the digest of what it names (manifest or index).
func (s *Store) resolve(ctx context.Context, ep endpoint, n Named, auth *Auth) (string, error) {
	rc, err := remoteRef(ctx, ep, n, auth)
	if err != nil {
		return "", err
	}
	if desc, err := remote.Head(rc.ref, rc.opts...); err == nil {
		return desc.Digest.String(), nil
	}
	desc, err := remote.Get(rc.ref, rc.opts...)
	if err != nil {
		return "", classify(err)
	}
	return desc.Digest.String(), nil
}

// pullFrom pulls n (by digest when it has one) from one endpoint and
// stores it under names plus repo@digest. asked is the reference as the
// caller gave it (n may carry a digest resolved from its tag). When a
// signature policy is set, the image must pass it before anything of it
// is stored.
func (s *Store) pullFrom(ctx context.Context, ep endpoint, n, asked Named, names []string, auth *Auth, w *pullWatch, policy SignaturePolicy) (*Image, error) {
	rc, err := remoteRef(ctx, ep, n, auth)
	if err != nil {
		return nil, err
	}
	w.step()
	desc, err := remote.Get(rc.ref, rc.opts...)
	if err != nil {
		return nil, classify(err)
	}
	w.step()
	if policy != nil {
		// desc.Digest is computed from the manifest received (and, by
		// digest, checked against it): the index, manifest, config and
		// layers stored below all hang from it by digest.
		err := policy.Check(ctx, SignatureCheck{
			Ref: asked, Digest: desc.Digest.String(),
			Source: fmt.Sprintf("tag %s:%s and the referrers of %s on %s", n.Repo(), cosignSignatureTag(desc.Digest.String()), desc.Digest, ep),
			Signatures: func(ctx context.Context) ([]CosignSignature, error) {
				sigs, err := rc.imageSignatures(ctx, desc.Digest.String())
				w.step()
				return sigs, err
			},
		})
		if err != nil {
			return nil, err
		}
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
	open := func(ctx context.Context, lr layerMeta) (io.ReadCloser, error) {
		return rc.openBlob(ctx, lr.Digest)
	}
	return s.commit(ctx, img, names, open, w)
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

// layerParallelism is how many layers of one image download and unpack at
// once: enough to overlap one layer's network waits with another's
// decompression on a small node, few enough not to thrash its disk.
const layerParallelism = 3

// blobOpener starts reading a layer's compressed blob.
type blobOpener func(ctx context.Context, lr layerMeta) (io.ReadCloser, error)

// commit stores img's blobs and layers and then its metadata under names
// (repo:tag and repo@digest strings). Used by pulls and imports: open
// fetches a layer blob (nil: img's own layers). w, if set, hears about
// progress.
func (s *Store) commit(ctx context.Context, img v1.Image, names []string, open blobOpener, w *pullWatch) (*Image, error) {
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
	chains := make([]string, len(rec.Layers))
	for i, lr := range rec.Layers {
		chains[i] = lr.ChainID
	}
	w.waitFor(chains)
	if open == nil {
		open = func(ctx context.Context, lr layerMeta) (io.ReadCloser, error) {
			for _, l := range layers {
				if d, err := l.Digest(); err == nil && d.String() == lr.Digest {
					return l.Compressed()
				}
			}
			return nil, fmt.Errorf("layer %s: not in the image: %w", lr.Digest, errdefs.ErrNotFound)
		}
	}
	// Each layer unpacks into its own dir, so layers stream in parallel, a
	// few at a time.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(layerParallelism)
	// As each layer is in place its files start going to disk, while
	// the others still unpack, so the syncfs below waits for little.
	var early sync.WaitGroup
	var earlyRunning atomic.Bool
	defer early.Wait()
	for _, lr := range rec.Layers {
		g.Go(func() error {
			if err := s.ensureLayer(gctx, lr, open); err != nil {
				return err
			}
			if earlyRunning.CompareAndSwap(false, true) {
				early.Add(1)
				go func() {
					defer early.Done()
					defer earlyRunning.Store(false)
					_ = s.syncStore() // a head start only; the one below counts
				}()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// One flush of the filesystem makes every blob and layer file this
	// pull wrote durable before the record that makes them an image
	// (decision 1510): no fsync per file or blob on the way.
	synced := time.Now()
	if err := s.syncStore(); err != nil {
		return nil, err
	}
	s.log.Debug("image store synced", "image", rec.ID, "took", time.Since(synced))
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

// writeBlob stores a small blob (manifest, config) after checking its
// digest. Not synced: commit's syncStore does that before the record.
func (s *Store) writeBlob(digest string, data []byte) error {
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return fmt.Errorf("blob %s: content has digest %s: %w", digest, got, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(s.blobPath(digest)); err == nil {
		return nil
	}
	tmp := s.path("ingest", "blob-"+strings.TrimPrefix(digest, "sha256:")+"-"+randomHex())
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("store blob %s: %w", digest, err)
	}
	if err := os.Rename(tmp, s.blobPath(digest)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("store blob %s: %w", digest, err)
	}
	return nil
}

// syncStore flushes the filesystem holding the store (syncfs(2)): the
// blobs and layer files written since are on disk when it returns.
func (s *Store) syncStore() error {
	f, err := os.Open(s.dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync image store: %w", err)
	}
	return nil
}

// ensureLayer makes layer lr present, its blob in blobs/ and its unpacked
// dir in layers/, once per chain ID however many pulls need it at once.
func (s *Store) ensureLayer(ctx context.Context, lr layerMeta, open blobOpener) error {
	for attempt := 0; ; attempt++ {
		err := s.fetchLayer(ctx, lr, open)
		// A shared stream started by a pull whose callers all left is
		// cancelled; a caller still waiting streams it again itself.
		if err != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil && attempt == 0 {
			continue
		}
		return err
	}
}

func (s *Store) layerPresent(lr layerMeta) bool {
	if _, err := os.Stat(s.LayerDiffDir(lr.ChainID)); err != nil {
		return false
	}
	_, err := os.Stat(s.blobPath(lr.Digest))
	return err == nil
}

func (s *Store) fetchLayer(ctx context.Context, lr layerMeta, open blobOpener) (err error) {
	if s.layerPresent(lr) {
		return nil
	}
	ctx, span := tracing.Start(ctx, "image.layer.fetch", tracing.AttrLayer.String(lr.Digest))
	defer func() { tracing.End(span, err) }()
	_, err = s.layers.Do(ctx, lr.ChainID, func(ctx context.Context) (struct{}, error) {
		if s.layerPresent(lr) {
			return struct{}{}, nil
		}
		err := s.streamLayer(ctx, lr, open)
		if err == nil && ctx.Err() != nil {
			// Every pull that wanted the layer left (one failed) while it
			// was being stored: nothing will record it, collect it.
			s.requestGC()
		}
		return struct{}{}, err
	})
	return err
}

// streamLayer reads lr's blob once, as it arrives: its bytes are hashed
// and written to a blob file in ingest/ while they are decompressed,
// hashed again and unpacked into a layer dir in ingest/. Only when both
// digests match (blob digest and diff ID) and the blob had its announced
// size do the two move into blobs/ and layers/; any failure, a digest
// mismatch included, removes what the stream wrote. A blob already stored
// is unpacked from disk; a layer already unpacked only has its blob
// fetched.
func (s *Store) streamLayer(ctx context.Context, lr layerMeta, open blobOpener) error {
	_, err := os.Stat(s.blobPath(lr.Digest))
	haveBlob := err == nil
	_, err = os.Stat(s.LayerDiffDir(lr.ChainID))
	unpack := err != nil

	var src io.ReadCloser
	if haveBlob {
		src, err = os.Open(s.blobPath(lr.Digest))
	} else {
		src, err = open(ctx, lr)
	}
	if err != nil {
		return fmt.Errorf("fetch layer %s: %w", lr.Digest, classify(err))
	}
	defer src.Close()

	var tmpBlob, tmpLayer string
	done := false
	defer func() {
		if done {
			return
		}
		if tmpBlob != "" {
			os.Remove(tmpBlob)
		}
		if tmpLayer != "" {
			os.RemoveAll(tmpLayer)
		}
	}()
	count, stopCount := s.streams.start(lr.ChainID)
	defer stopCount()
	var r io.Reader = &progressReader{ctx: ctx, r: src, n: count}
	blobHash := sha256.New()
	if !haveBlob {
		tmpBlob = s.path("ingest", "blob-"+strings.TrimPrefix(lr.Digest, "sha256:")+"-"+randomHex())
		f, err := os.OpenFile(tmpBlob, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		// One byte over the announced size is enough to refuse the blob.
		r = io.TeeReader(io.LimitReader(r, lr.Size+1), &hashFile{h: blobHash, f: f})
	}
	if unpack {
		tmpLayer = s.path("ingest", "layer-"+strings.TrimPrefix(lr.ChainID, "sha256:")+"-"+randomHex())
		if err := os.MkdirAll(filepath.Join(tmpLayer, "diff"), 0o755); err != nil {
			return err
		}
		_, span := tracing.Start(ctx, "image.layer.unpack", tracing.AttrLayer.String(lr.Digest))
		err = s.unpackStream(r, lr, filepath.Join(tmpLayer, "diff"))
		tracing.End(span, err)
	}
	if err == nil {
		// What the decompressor left unread (the whole blob when only the
		// blob was missing) still counts for the blob's digest.
		if _, err = io.Copy(io.Discard, r); err != nil {
			err = fmt.Errorf("layer %s: read: %w", lr.Digest, err)
		}
	}
	n := count.Load()
	if s.observer != nil && !haveBlob {
		s.observer.PulledBytes(n)
	}
	// A blob longer than announced is the clearer error when the stream
	// broke for it.
	if !haveBlob && n > lr.Size {
		return fmt.Errorf("layer %s: received more than the %d bytes the manifest says: %w", lr.Digest, lr.Size, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return err
	}
	if !haveBlob {
		if n != lr.Size {
			return fmt.Errorf("layer %s: received %d bytes, the manifest says %d: %w", lr.Digest, n, lr.Size, errdefs.ErrInvalidArgument)
		}
		got := "sha256:" + hex.EncodeToString(blobHash.Sum(nil))
		if err := s.faults.Fail(fault.ImageFailLayerDigest); err != nil {
			got = "sha256:" + strings.Repeat("0", 64) + " (" + err.Error() + ")"
		}
		if got != lr.Digest {
			return fmt.Errorf("layer %s: downloaded content has digest %s: %w", lr.Digest, got, errdefs.ErrInvalidArgument)
		}
		if err := os.Rename(tmpBlob, s.blobPath(lr.Digest)); err != nil {
			return fmt.Errorf("store blob %s: %w", lr.Digest, err)
		}
		tmpBlob = ""
	}
	if unpack {
		if err := os.Rename(tmpLayer, s.layerDir(lr.ChainID)); err != nil {
			return fmt.Errorf("store layer %s: %w", lr.ChainID, err)
		}
		tmpLayer = ""
		s.faults.Hit(fault.ImageMidUnpack, "layer", lr.ChainID)
	}
	done = true
	return nil
}

// A layer's decompressed stream is read ahead by up to 2 MiB.
const (
	readAheadChunk = 128 << 10
	readAheadDepth = 16
)

// unpackStream decompresses the blob stream r into dir and checks the
// uncompressed digest against the diff ID. Decompression (with the
// download and hashing before it) runs ahead of the unpack on its own
// goroutine.
func (s *Store) unpackStream(r io.Reader, lr layerMeta, dir string) error {
	rc, err := Decompress(r)
	if err != nil {
		return fmt.Errorf("layer %s: %w", lr.Digest, err)
	}
	defer rc.Close()
	h := sha256.New()
	ra := newReadAhead(io.TeeReader(rc, h), readAheadChunk, readAheadDepth)
	defer ra.Close()
	if _, err := Unpack(ra, dir, lr.Digest, s.unpack); err != nil {
		return err
	}
	// Tar padding after the end marker still counts for the diff ID.
	if _, err := io.Copy(io.Discard, ra); err != nil {
		return fmt.Errorf("layer %s: read: %w", lr.Digest, err)
	}
	ra.Close() // the hash is complete once the filler returned
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != lr.DiffID {
		return fmt.Errorf("layer %s: uncompressed digest %s, config says %s: %w", lr.Digest, got, lr.DiffID, errdefs.ErrInvalidArgument)
	}
	return nil
}

// hashFile hashes what is written and writes it to f.
type hashFile struct {
	h hash.Hash
	f *os.File
}

func (w *hashFile) Write(p []byte) (int, error) {
	w.h.Write(p)
	return w.f.Write(p)
}
