package security

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// TestAmbiguousManifestRefused is CVE-2021-41190 (distribution
// GHSA-mc8v-mgrf-8f4m, containerd GHSA-5j5w-g665-5m35): a manifest
// document that reads as an image manifest or as an index depending on
// the reader — both `manifests` and `layers`, an index with `layers`, a
// `mediaType` of the other kind than its Content-Type — has one digest
// for both readings, so whatever was signed or pinned by that digest can
// be pulled as something else. berthd refuses it with InvalidArgument and
// stores nothing; each document would pull a working image if accepted.
func TestAmbiguousManifestRefused(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := startCredsRegistry(t, false)
	img := credsImage(t, t.Name())
	reg.pushImage(t, "app:1", img)
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	dg, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	var manifest map[string]any
	if err := json.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	child := map[string]any{"mediaType": string(types.OCIManifestSchema1), "digest": dg.String(), "size": len(raw),
		"platform": map[string]any{"os": "linux", "architecture": runtime.GOARCH}}
	with := func(base map[string]any, k string, v any) map[string]any {
		out := map[string]any{}
		for kk, vv := range base {
			out[kk] = vv
		}
		out[k] = v
		return out
	}
	index := map[string]any{"schemaVersion": 2, "mediaType": string(types.OCIImageIndex), "manifests": []any{child}}

	// An unambiguous index whose chosen image manifest is the ambiguous
	// one of the first case (pushed there, found here by digest).
	mixed, err := json.Marshal(with(manifest, "manifests", []any{child}))
	if err != nil {
		t.Fatal(err)
	}
	mixedChild := with(child, "digest", fmt.Sprintf("sha256:%x", sha256.Sum256(mixed)))
	mixedChild["size"] = len(mixed)
	ambiguousPutManifest(t, reg, mixedChild["digest"].(string), mixed, types.OCIManifestSchema1)

	before := ambiguousListImages(t, d)
	for _, tc := range []struct {
		name        string
		tag         string
		doc         map[string]any
		contentType types.MediaType
	}{
		{"image manifest with manifests", "mixed-manifest", with(manifest, "manifests", []any{child}), types.OCIManifestSchema1},
		{"index with layers", "mixed-index", with(index, "layers", manifest["layers"]), types.OCIImageIndex},
		{"index with config", "index-config", with(index, "config", manifest["config"]), types.OCIImageIndex},
		{"manifest served as one, mediaType of an index", "mediatype", with(manifest, "mediaType", string(types.OCIImageIndex)), types.OCIManifestSchema1},
		{"index choosing an ambiguous image manifest", "child", with(index, "manifests", []any{mixedChild}), types.OCIImageIndex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, err := json.Marshal(tc.doc)
			if err != nil {
				t.Fatal(err)
			}
			ambiguousPutManifest(t, reg, tc.tag, body, tc.contentType)
			ref := reg.Host + "/app:" + tc.tag
			_, err = d.Image.PullImage(berthdtest.Ctx(t), &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
			t.Logf("pull: %v", err)
			berthdtest.WantCode(t, err, codes.InvalidArgument)
			st, err := d.Image.ImageStatus(berthdtest.Ctx(t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: ref}})
			if err != nil {
				t.Fatal(err)
			}
			if st.Image != nil {
				t.Errorf("the refused image is stored as %s", st.Image.Id)
			}
			if after := ambiguousListImages(t, d); len(after) != len(before) {
				t.Errorf("images before %v, after %v", before, after)
			}
		})
	}
}

func ambiguousListImages(t *testing.T, d *berthdtest.Daemon) []string {
	t.Helper()
	resp, err := d.Image.ListImages(berthdtest.Ctx(t), &criapi.ListImagesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, im := range resp.Images {
		out = append(out, im.Id)
	}
	return out
}

// ambiguousPutManifest stores body as app:<tagOrDigest> with contentType,
// as the registry's client (and attacker) may.
func ambiguousPutManifest(t *testing.T, reg *credsRegistry, tagOrDigest string, body []byte, contentType types.MediaType) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, "http://"+reg.push+"/v2/app/manifests/"+tagOrDigest, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", string(contentType))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put manifest %s: %s", tagOrDigest, resp.Status)
	}
}
