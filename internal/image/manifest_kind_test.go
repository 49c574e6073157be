package image

import (
	"errors"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestCheckManifestKind(t *testing.T) {
	const (
		desc  = `{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:aa","size":1}`
		layer = `{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:bb","size":1}`
		cfg   = `{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:cc","size":1}`
	)
	for _, tc := range []struct {
		name string
		raw  string
		ct   types.MediaType
		ok   bool
	}{
		{"image manifest", `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":` + cfg + `,"layers":[` + layer + `]}`, types.OCIManifestSchema1, true},
		{"docker manifest without mediaType", `{"schemaVersion":2,"config":` + cfg + `,"layers":[` + layer + `]}`, types.DockerManifestSchema2, true},
		{"index", `{"schemaVersion":2,"manifests":[` + desc + `]}`, types.OCIImageIndex, true},
		{"index with an unknown content type", `{"schemaVersion":2,"manifests":[` + desc + `]}`, "application/json", true},
		{"manifest with manifests", `{"schemaVersion":2,"config":` + cfg + `,"layers":[` + layer + `],"manifests":[` + desc + `]}`, types.OCIManifestSchema1, false},
		{"index with layers", `{"schemaVersion":2,"manifests":[` + desc + `],"layers":[` + layer + `]}`, types.OCIImageIndex, false},
		{"index with config only", `{"schemaVersion":2,"config":` + cfg + `}`, types.OCIImageIndex, false},
		{"both under an unknown content type", `{"manifests":[],"layers":[]}`, "application/json", false},
		{"manifest content type, index mediaType", `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","config":` + cfg + `,"layers":[]}`, types.OCIManifestSchema1, false},
		{"not JSON", `{`, types.OCIManifestSchema1, false},
	} {
		err := checkManifestKind([]byte(tc.raw), tc.ct)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}
