package security

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// TestImageHugeDeclaredConfigNotRead (issue 34 finding 5, the
// CVE-2023-25153 class): a manifest that declares a 256 MiB config is
// refused with ResourceExhausted before one byte of the config is
// fetched. On b407862 berthd read the whole 256 MiB into memory (the
// registry served it) before the digest check failed.
func TestImageHugeDeclaredConfigNotRead(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	reg := testimages.StartRegistry(t)
	img := unpackImage(t, []string{"true"})
	reg.Push(t, "hugecfg:real", img)
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	const declared = 256 << 20
	m.Config.Size = declared
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPut, "http://"+reg.Host+"/v2/hugecfg/manifests/1", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", string(m.MediaType))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("push manifest: %s", resp.Status)
	}
	// The config as a hostile registry serves it: as big as declared.
	var served atomic.Int64
	chunk := bytes.Repeat([]byte(" "), 1<<20)
	reg.ServeBlobWith(t, cfg.String(), func(w http.ResponseWriter, req *http.Request, _ []byte) {
		w.Header().Del("Content-Length")
		w.WriteHeader(http.StatusOK)
		for i := 0; i < declared>>20; i++ {
			n, err := w.Write(chunk)
			served.Add(int64(n))
			if err != nil {
				return
			}
		}
	})

	err = unpackPull(t, d, reg.Ref("hugecfg:1"))
	berthdtest.WantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "config") {
		t.Fatalf("refusal %q does not name the config", err)
	}
	if n := reg.BlobFetches(cfg.String()); n != 0 || served.Load() != 0 {
		t.Fatalf("the config was fetched %d times, %d bytes served: want none", n, served.Load())
	}
}
