package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/errdefs"
)

// Annotations naming an image in an OCI layout index.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

var layoutBlobName = regexp.MustCompile(`^blobs/sha256/[a-f0-9]{64}$`)

// Import stores the images of an archive: a docker-archive (`docker save`,
// manifest.json) or an OCI image layout tarball (index.json). Images keep
// the names the archive gives them; layers are verified and unpacked as in
// a pull.
func (s *Store) Import(ctx context.Context, r io.Reader) ([]*Image, error) {
	work := s.path("ingest", "import-"+randomHex())
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	archive := filepath.Join(work, "archive.tar")
	f, err := os.OpenFile(archive, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = copyCtx(ctx, f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("receive image archive: %w", err)
	}
	entries, err := readArchiveEntries(archive)
	if err != nil {
		return nil, fmt.Errorf("read image archive: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	switch {
	case entries.has("manifest.json"):
		return s.importDockerArchive(ctx, archive, entries)
	case entries.has("index.json"):
		dir := filepath.Join(work, "layout")
		if err := extractLayout(archive, dir); err != nil {
			return nil, err
		}
		return s.importLayout(ctx, dir)
	}
	return nil, fmt.Errorf("image archive has neither manifest.json (docker-archive) nor index.json (OCI layout): %w", errdefs.ErrInvalidArgument)
}

// Bounds of an import archive, whose JSON files go-containerregistry reads
// whole: maxImportJSON for manifest.json and index.json (containerd's
// limit since CVE-2023-25153), maxArchiveEntries for the names kept while
// reading it (a docker save of a hundred images has a few thousand).
const (
	maxImportJSON     = 20 << 20
	maxArchiveEntries = 1 << 16
)

// archiveEntry is what an import needs of one tar entry before reading it.
type archiveEntry struct {
	typ  byte
	size int64
	link string
}

// archiveEntries are an archive's entries by cleaned name, the first of
// each name (the one go-containerregistry's reader opens).
type archiveEntries map[string]archiveEntry

func (e archiveEntries) has(name string) bool {
	_, ok := e[name]
	return ok
}

// size is the size of the file name opens, following links as
// go-containerregistry's tarball reader does.
func (e archiveEntries) size(name string) (int64, error) {
	seen := map[string]bool{}
	for {
		n := path.Clean(name)
		if seen[n] {
			return 0, fmt.Errorf("link cycle at %s", name)
		}
		seen[n] = true
		ent, ok := e[n]
		if !ok {
			return 0, fmt.Errorf("%s is not in the archive", name)
		}
		if ent.typ != tar.TypeSymlink && ent.typ != tar.TypeLink {
			return ent.size, nil
		}
		name = path.Join(path.Dir(n), path.Clean(ent.link))
	}
}

// checkSize refuses the archive file name when it is over max bytes, or
// missing, before anything reads it whole.
func (e archiveEntries) checkSize(name string, max int64) error {
	n, err := e.size(name)
	if err != nil {
		return fmt.Errorf("image archive: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if n > max {
		return fmt.Errorf("image archive: %s of %d bytes, over the limit of %d: %w", name, n, max, errdefs.ErrResourceExhausted)
	}
	return nil
}

func readArchiveEntries(p string) (archiveEntries, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries := archiveEntries{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries, nil
		}
		if err != nil {
			return nil, err
		}
		n := path.Clean(h.Name)
		if _, ok := entries[n]; ok {
			continue
		}
		if len(entries) >= maxArchiveEntries {
			return nil, fmt.Errorf("more than %d entries", maxArchiveEntries)
		}
		entries[n] = archiveEntry{typ: h.Typeflag, size: h.Size, link: h.Linkname}
	}
}

// extractLayout writes only the files an OCI layout consists of; anything
// else in the archive is ignored, so no archive path reaches the host.
func extractLayout(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read OCI layout archive: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		n := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || !(n == "index.json" || n == "oci-layout" || layoutBlobName.MatchString(n)) {
			continue
		}
		if (n == "index.json" || n == "oci-layout") && h.Size > maxImportJSON {
			return fmt.Errorf("OCI layout archive: %s of %d bytes, over the limit of %d: %w", n, h.Size, maxImportJSON, errdefs.ErrResourceExhausted)
		}
		out, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(n)), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("extract %s: %w", n, err)
		}
	}
}

func (s *Store) importDockerArchive(ctx context.Context, archive string, entries archiveEntries) ([]*Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(archive) }
	// go-containerregistry reads manifest.json and each config whole.
	if err := entries.checkSize("manifest.json", maxImportJSON); err != nil {
		return nil, err
	}
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("docker-archive manifest.json: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	policy := s.settings().SignaturePolicy
	type pending struct {
		img   v1.Image
		names []string
	}
	var todo []pending
	for i, d := range m {
		var tag *name.Tag
		if len(d.RepoTags) > 0 {
			t, err := name.NewTag(d.RepoTags[0])
			if err != nil {
				return nil, fmt.Errorf("docker-archive tag %q: %w", d.RepoTags[0], errdefs.ErrInvalidArgument)
			}
			tag = &t
		} else if len(m) > 1 {
			return nil, fmt.Errorf("docker-archive image %d has no tag and is not the only one: %w", i, errdefs.ErrInvalidArgument)
		}
		if err := entries.checkSize(d.Config, maxConfigSize); err != nil {
			return nil, fmt.Errorf("docker-archive image %d config: %w", i, err)
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return nil, fmt.Errorf("docker-archive image %d: %w: %w", i, err, errdefs.ErrInvalidArgument)
		}
		var names []string
		var refs []Named
		for _, t := range d.RepoTags {
			n, err := ParseReference(t)
			if err != nil {
				return nil, err
			}
			names = append(names, n.TagRef())
			refs = append(refs, n)
		}
		if err := checkImport(ctx, policy, refs, img); err != nil {
			return nil, fmt.Errorf("import docker-archive image %d: %w", i, err)
		}
		todo = append(todo, pending{img, names})
	}
	// Every image passed the policy before the first is stored.
	var out []*Image
	for i, p := range todo {
		stored, err := s.commit(ctx, p.img, p.names, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("import docker-archive image %d: %w", i, err)
		}
		out = append(out, stored)
	}
	return out, nil
}

// checkImport applies the signature policy to an imported image under
// each of its names (the defaults when it has none). An archive carries
// no signature berth reads, so only scopes that accept anything let it
// in (docs/signature-policy.md).
func checkImport(ctx context.Context, policy SignaturePolicy, refs []Named, img v1.Image) error {
	if policy == nil {
		return nil
	}
	d, err := img.Digest()
	if err != nil {
		return fmt.Errorf("manifest digest: %w", err)
	}
	if len(refs) == 0 {
		refs = []Named{{}}
	}
	for _, n := range refs {
		err := policy.Check(ctx, SignatureCheck{
			Ref: n, Digest: d.String(),
			Source: "an imported archive: berthctl image import reads no signatures",
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) importLayout(ctx context.Context, dir string) ([]*Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout index.json: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	policy := s.settings().SignaturePolicy
	type pending struct {
		img   v1.Image
		names []string
		desc  v1.Descriptor
	}
	var todo []pending
	for _, desc := range im.Manifests {
		var img v1.Image
		if desc.MediaType.IsIndex() || desc.MediaType.IsImage() {
			if err := layoutBlobFits(dir, desc.Digest, maxManifestSize); err != nil {
				return nil, err
			}
		}
		switch {
		case desc.MediaType.IsIndex():
			sub, err := idx.ImageIndex(desc.Digest)
			if err != nil {
				return nil, fmt.Errorf("OCI layout index %s: %w", desc.Digest, err)
			}
			sm, err := sub.IndexManifest()
			if err != nil {
				return nil, fmt.Errorf("OCI layout index %s: %w", desc.Digest, err)
			}
			chosen, err := pickManifest(sm)
			if err != nil {
				return nil, err
			}
			if err := layoutBlobFits(dir, chosen.Digest, maxManifestSize); err != nil {
				return nil, err
			}
			if img, err = sub.Image(chosen.Digest); err != nil {
				return nil, fmt.Errorf("OCI layout image %s: %w", chosen.Digest, err)
			}
		case desc.MediaType.IsImage():
			if img, err = idx.Image(desc.Digest); err != nil {
				return nil, fmt.Errorf("OCI layout image %s: %w", desc.Digest, err)
			}
		default:
			continue
		}
		m, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("OCI layout image %s: %w: %w", desc.Digest, err, errdefs.ErrInvalidArgument)
		}
		// The layout reads the config's file whole, whatever the manifest
		// says its size is.
		if err := layoutBlobFits(dir, m.Config.Digest, maxConfigSize); err != nil {
			return nil, err
		}
		var names []string
		var refs []Named
		if n, ok := layoutName(desc.Annotations); ok {
			if n.Tag != "" {
				names = append(names, n.TagRef())
			}
			names = append(names, n.Repo()+"@"+desc.Digest.String())
			refs = append(refs, n)
		}
		if err := checkImport(ctx, policy, refs, img); err != nil {
			return nil, fmt.Errorf("import OCI layout image %s: %w", desc.Digest, err)
		}
		todo = append(todo, pending{img, names, desc})
	}
	var out []*Image
	for _, p := range todo {
		stored, err := s.commit(ctx, p.img, p.names, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("import OCI layout image %s: %w", p.desc.Digest, err)
		}
		out = append(out, stored)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("OCI layout has no images: %w", errdefs.ErrInvalidArgument)
	}
	return out, nil
}

// layoutBlobFits refuses an OCI layout blob that go-containerregistry would
// read whole into memory when its file is over max bytes.
func layoutBlobFits(dir string, h v1.Hash, max int64) error {
	if h.Algorithm != "sha256" || !digestPattern.MatchString(h.String()) {
		return fmt.Errorf("OCI layout: digest %q is not sha256:<64 hex>: %w", h, errdefs.ErrInvalidArgument)
	}
	fi, err := os.Stat(filepath.Join(dir, "blobs", "sha256", h.Hex))
	if err != nil {
		return fmt.Errorf("OCI layout: blob %s: %w: %w", h, err, errdefs.ErrInvalidArgument)
	}
	if fi.Size() > max {
		return fmt.Errorf("OCI layout: blob %s of %d bytes, over the limit of %d: %w", h, fi.Size(), max, errdefs.ErrResourceExhausted)
	}
	return nil
}

// layoutName is the full image name an OCI layout entry carries: containerd's
// annotation, or ref.name when it is a whole reference rather than a bare tag.
func layoutName(ann map[string]string) (Named, bool) {
	for _, key := range []string{annotationContainerdName, annotationRefName} {
		v := ann[key]
		if v == "" || (key == annotationRefName && !strings.ContainsAny(v, "/")) {
			continue
		}
		if n, err := ParseReference(v); err == nil {
			return n, true
		}
	}
	return Named{}, false
}

// Export writes the image ref names as a docker-archive (what `docker save`
// writes and `docker load` and Import read) with its tags.
func (s *Store) Export(ctx context.Context, ref string, w io.Writer) error {
	var meta *imageMeta
	var keys, tags []string
	// Marked while the image cannot be removed: its blobs stay until the
	// export is written.
	err := s.index.withImage(ref, func(m *imageMeta) error {
		meta = m
		keys = []string{m.ManifestDigest, m.ConfigDigest}
		for _, l := range m.Layers {
			keys = append(keys, l.Digest)
		}
		s.refs.mark(keys, 1)
		tags = append([]string(nil), m.RepoTags...)
		return nil
	})
	if err != nil {
		return err
	}
	defer s.refs.mark(keys, -1)

	manifest, err := s.content.read(meta.ManifestDigest)
	if err != nil {
		return fmt.Errorf("export %s: manifest: %w", meta.ID, err)
	}
	var mt struct {
		MediaType types.MediaType `json:"mediaType"`
	}
	_ = json.Unmarshal(manifest, &mt)
	if mt.MediaType == "" {
		mt.MediaType = types.OCIManifestSchema1
	}
	img, err := partial.CompressedToImage(&storedImage{s: s, meta: meta, manifest: manifest, mediaType: mt.MediaType})
	if err != nil {
		return fmt.Errorf("export %s: %w", meta.ID, err)
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		tag, err := name.NewTag(t)
		if err != nil {
			return fmt.Errorf("export %s: tag %q: %w", meta.ID, t, err)
		}
		refs[tag] = img
	}
	if len(refs) == 0 {
		d, err := name.NewDigest("berth.invalid/untagged@" + meta.ManifestDigest)
		if err != nil {
			return err
		}
		refs[d] = img
	}
	if err := tarball.MultiRefWrite(refs, &ctxWriter{ctx: ctx, w: w}); err != nil {
		return fmt.Errorf("export %s: %w", meta.ID, err)
	}
	return nil
}

// storedImage serves a stored image to go-containerregistry's writers.
type storedImage struct {
	s         *Store
	meta      *imageMeta
	manifest  []byte
	mediaType types.MediaType
}

func (i *storedImage) RawConfigFile() ([]byte, error) {
	return i.s.content.read(i.meta.ConfigDigest)
}
func (i *storedImage) MediaType() (types.MediaType, error) { return i.mediaType, nil }
func (i *storedImage) RawManifest() ([]byte, error)        { return bytes.Clone(i.manifest), nil }

func (i *storedImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range i.meta.Layers {
		if l.Digest == h.String() {
			return &storedLayer{s: i.s, l: l}, nil
		}
	}
	if h.String() == i.meta.ConfigDigest {
		return &storedLayer{s: i.s, l: layerMeta{Digest: i.meta.ConfigDigest, MediaType: string(types.OCIConfigJSON)}}, nil
	}
	return nil, fmt.Errorf("blob %s is not part of image %s: %w", h, i.meta.ID, errdefs.ErrNotFound)
}

type storedLayer struct {
	s *Store
	l layerMeta
}

func (l *storedLayer) Digest() (v1.Hash, error)           { return v1.NewHash(l.l.Digest) }
func (l *storedLayer) Compressed() (io.ReadCloser, error) { return l.s.content.open(l.l.Digest) }
func (l *storedLayer) MediaType() (types.MediaType, error) {
	return types.MediaType(l.l.MediaType), nil
}
func (l *storedLayer) Size() (int64, error) { return l.s.content.size(l.l.Digest) }

type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// copyCtx is io.Copy with a context check between chunks.
func copyCtx(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		m, rerr := src.Read(buf)
		if m > 0 {
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
