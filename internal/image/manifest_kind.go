package image

import (
	"encoding/json"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/errdefs"
)

// checkManifestKind refuses a manifest document that reads as an image
// manifest or as an index depending on who reads it (CVE-2021-41190,
// GHSA-mc8v-mgrf-8f4m; containerd GHSA-5j5w-g665-5m35): one that holds
// both `manifests` and `layers` or `config`, an index (by its
// Content-Type) with `layers` or `config`, an image manifest with
// `manifests`, or a `mediaType` field of the other kind than its
// Content-Type. Its digest is the same whichever way it is read, so a
// signature over it would pass either reading; berth refuses it as the
// distribution spec now says clients must.
func checkManifestKind(raw []byte, contentType types.MediaType) error {
	var doc struct {
		MediaType types.MediaType `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
		Layers    json.RawMessage `json:"layers"`
		Config    json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("manifest (%s): %v: %w", contentType, err, errdefs.ErrInvalidArgument)
	}
	asIndex := doc.Manifests != nil
	asImage := doc.Layers != nil || doc.Config != nil
	refuse := func(why string) error {
		return fmt.Errorf("ambiguous manifest (served as %s): %s (CVE-2021-41190): %w", contentType, why, errdefs.ErrInvalidArgument)
	}
	switch {
	case asIndex && asImage:
		return refuse("it has both manifests and layers or config")
	case contentType.IsIndex() && asImage:
		return refuse("an index with layers or config")
	case contentType.IsImage() && asIndex:
		return refuse("an image manifest with manifests")
	case doc.MediaType != "" && (doc.MediaType.IsIndex() && contentType.IsImage() || doc.MediaType.IsImage() && contentType.IsIndex()):
		return refuse(fmt.Sprintf("its mediaType is %s", doc.MediaType))
	}
	return nil
}

// checkChildManifestKind is checkManifestKind for the image an index
// chose (its manifest is fetched here, and kept for the commit).
func checkChildManifestKind(img v1.Image) error {
	raw, err := img.RawManifest()
	if err != nil {
		return classify(err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return classify(err)
	}
	return checkManifestKind(raw, mt)
}
