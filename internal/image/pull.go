package image

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/berthcri/berth/internal/errdefs"
)

// Pull orchestration: settings, signature policy, endpoints (mirrors
// first), the manifest, and then commit (commit.go), which stores what the
// manifest names.

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
		img, err := s.pullFrom(ctx, ep, target, n, names, auth, w, set)
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
func (s *Store) pullFrom(ctx context.Context, ep endpoint, n, asked Named, names []string, auth *Auth, w *pullWatch, set PullSettings) (*Image, error) {
	policy, ranges := set.SignaturePolicy, set.RangeFetch
	rc, err := remoteRef(ctx, ep, n, auth)
	if err != nil {
		return nil, err
	}
	w.step()
	desc, err := remote.Get(rc.ref, rc.opts...)
	if err != nil {
		return nil, classify(err)
	}
	if err := checkManifestKind(desc.Manifest, desc.MediaType); err != nil {
		return nil, err
	}
	w.step()
	if desc.Size > maxManifestSize {
		return nil, fmt.Errorf("manifest %s of %d bytes, over the limit of %d: %w", desc.Digest, desc.Size, maxManifestSize, errdefs.ErrResourceExhausted)
	}
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
		// Checked before it is fetched: the index says how big it is.
		if chosen.Size < 0 || chosen.Size > maxManifestSize {
			return nil, fmt.Errorf("manifest %s declares %d bytes, over the limit of %d: %w", chosen.Digest, chosen.Size, maxManifestSize, errdefs.ErrResourceExhausted)
		}
		if img, err = idx.Image(chosen.Digest); err != nil {
			return nil, classify(err)
		}
		if err := checkChildManifestKind(img); err != nil {
			return nil, err
		}
	} else if img, err = desc.Image(); err != nil {
		return nil, classify(err)
	}
	names = append(slices.Clone(names), n.Repo()+"@"+desc.Digest.String())
	return s.commit(ctx, img, names, registryBlobs{c: rc, set: ranges, lazy: set.LazyPull, lazyTimeout: lazyTimeoutOf(set), lazyQuiet: set.LazyBackgroundQuiet}, w)
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
