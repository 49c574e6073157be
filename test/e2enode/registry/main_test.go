package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/berthcri/berth/internal/testutil/testimages"
)

// The stand-ins have what the specs run in them: the sh, env and nmeter
// of imagetools in busybox, agnhost's entrypoint and files.
func TestImages(t *testing.T) {
	if _, err := os.Stat(testimages.BusyboxPath); err != nil {
		t.Skip("no busybox-static")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// test/images of the kubernetes module: agnhost/porter's files,
	// kitten's and nautilus's html.
	k8sImages := t.TempDir()
	dir := k8sImages + "/agnhost/porter"
	files := map[string]string{dir + "/localhost.crt": "crt", dir + "/localhost.key": "key",
		k8sImages + "/kitten/html/kitten.jpg": "k", k8sImages + "/kitten/html/data.json": "{}",
		k8sImages + "/nautilus/html/nautilus.jpg": "n", k8sImages + "/nautilus/html/data.json": "{}"}
	for f, data := range files {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	imgs, err := images(sources{agnhost: self, tools: self, porter: dir, devicePlugin: self, coredns: self, sampleAPIServer: self, etcd: self})
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string][]string{
		"e2e-test-images/busybox:1.37.0-1": {"bin/sh", "bin/imagetools", "bin/nmeter", "bin/env", "bin/nc"},
		"e2e-test-images/busybox:1.36.1-1": {"bin/nmeter"},
		"e2e-test-images/agnhost:2.56":     {"agnhost", "agnhost-2", "localhost.crt", "localhost.key", "uploads", "usr/bin/curl", "usr/bin/nc", "bin/bash", "lib64/ld-linux-x86-64.so.2"},
		"e2e-test-images/nonewprivs:1.3":   {"usr/local/bin/nnp"},
		"e2e-test-images/nonroot:1.4":      {"bin/sh"},
		"e2e-test-images/nginx:1.14-4":     {"usr/share/nginx/html/index.html"},
		"e2e-test-images/httpd:2.4.38-4":   {"usr/local/apache2/htdocs/index.html"},
		"pause:3.10.1":                     {"pause"},
		// The tags of v1.37's e2e_node.test --list-images.
		"e2e-test-images/busybox:1.37.0-2":           {"bin/sh", "bin/nmeter"},
		"e2e-test-images/agnhost:2.66.1":             {"agnhost", "agnhost-2", "bin/bash", "usr/bin/dig", "usr/bin/getent"},
		"e2e-test-images/nginx:1.27.0-2":             {"usr/share/nginx/html/index.html"},
		"e2e-test-images/nginx:1.28.0-2":             {"usr/share/nginx/html/index.html"},
		"e2e-test-images/nonewprivs:1.4":             {"usr/local/bin/nnp"},
		"e2e-test-images/nonroot:1.5":                {"bin/sh"},
		"e2e-test-images/glibc-dns-testing:2.1.1":    {"bin/sh", "bin/bash", "bin/hostname", "etc/nsswitch.conf", "lib64/ld-linux-x86-64.so.2", "usr/bin/getent", "usr/bin/dig"},
		"pause:3.10.2":                               {"pause"},
		"e2e-test-images/sample-device-plugin:1.8.0": {"sampledeviceplugin", "bin/sh"},
		// make e2e-cluster's cluster DNS (-coredns).
		corednsRef: {"coredns"},
		// The cluster suite's.
		"e2e-test-images/kitten:1.8":   {"agnhost", "kitten.jpg", "data.json", "etc/os-release"},
		"e2e-test-images/nautilus:1.8": {"agnhost", "nautilus.jpg", "data.json"},
		sampleAPIServerRef:             {"sample-apiserver", "bin/sh"},
		etcdRef:                        {"usr/local/bin/etcd", "bin/sh"},
	} {
		img, ok := imgs[ref]
		if !ok {
			t.Errorf("no image %s", ref)
			continue
		}
		files := list(t, img)
		for _, w := range want {
			if !files[w] {
				t.Errorf("%s has no %s", ref, w)
			}
		}
	}
	// agnhost's fake-registry-server serves pause:3.10.2 as pause:testing.
	pd, err := imgs["pause:3.10.2"].Digest()
	if err != nil {
		t.Fatal(err)
	}
	ag := list(t, imgs["e2e-test-images/agnhost:2.66.1"])
	for _, f := range []string{"var/registry/pause/manifests/testing",
		"var/registry/pause/manifests/sha256/" + pd.Hex[:2] + "/" + pd.Hex + "/data"} {
		if !ag[f] {
			t.Errorf("agnhost has no %s", f)
		}
	}
	cf, err := imgs["e2e-test-images/agnhost:2.56"].ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/agnhost" {
		t.Errorf("agnhost entrypoint %q, want /agnhost", cf.Config.Entrypoint)
	}
}

func list(t *testing.T, img v1.Image) map[string]bool {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = true
	}
}
