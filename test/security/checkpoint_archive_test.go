package security

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// restoreArchiveEntry is one entry of a hand-made checkpoint archive.
type restoreArchiveEntry struct {
	name string
	data []byte
	link string // a symlink to link, when set
	// sparse, when set, makes a PAX 1.0 sparse entry: a few hundred bytes
	// of tar that read as sparse bytes of zeros.
	sparse int64
}

// restoreArchive writes a CheckpointContainer-style archive of entries to
// a file in dir and returns its path.
func restoreArchive(t *testing.T, dir string, entries []restoreArchiveEntry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		switch {
		case e.sparse > 0:
			if err := tw.Flush(); err != nil {
				t.Fatal(err)
			}
			buf.Write(restorePAXSparse(e.name, e.sparse))
		case e.link != "":
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeSymlink, Linkname: e.link, Mode: 0o777}); err != nil {
				t.Fatal(err)
			}
		default:
			if err := tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Size: int64(len(e.data)), Mode: 0o600}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(e.data); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, fmt.Sprintf("checkpoint-%d.tar", len(entries)))
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// restorePAXSparse is a PAX (GNU sparse 1.0) entry of name that reads as
// realsize bytes of zeros: Go's tar.Writer does not write them.
func restorePAXSparse(name string, realsize int64) []byte {
	ustar := func(name string, typ byte, size int) []byte {
		h := make([]byte, 512)
		copy(h[0:], name)
		copy(h[100:], "0000644\x00")
		copy(h[108:], "0000000\x00")
		copy(h[116:], "0000000\x00")
		copy(h[124:], fmt.Sprintf("%011o\x00", size))
		copy(h[136:], "00000000000\x00")
		h[156] = typ
		copy(h[257:], "ustar\x0000")
		copy(h[148:], "        ")
		sum := 0
		for _, b := range h {
			sum += int(b)
		}
		copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
		return h
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	record := func(k, v string) string {
		for n := len(k) + len(v) + 3; ; {
			s := fmt.Sprintf("%d %s=%s\n", n, k, v)
			if len(s) == n {
				return s
			}
			n = len(s)
		}
	}
	recs := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") +
		record("GNU.sparse.name", name) + record("GNU.sparse.realsize", fmt.Sprint(realsize))
	b := ustar("PaxHeaders/"+filepath.Base(name), 'x', len(recs))
	b = append(b, pad([]byte(recs))...)
	b = append(b, ustar("GNUSparseFile.0/"+filepath.Base(name), '0', 512)...)
	return append(b, pad([]byte("0\n"))...) // a map of no data: all hole
}

// restoreDumps are config.dump and spec.dump of a checkpointed busybox
// (imageID) whose process ran as uid:gid.
func restoreDumps(t *testing.T, imageID string, uid, gid uint32) []restoreArchiveEntry {
	t.Helper()
	cfg, err := json.Marshal(map[string]any{"id": "0123", "name": "restored", "rootfsImageRef": imageID})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(specs.Spec{Version: specs.Version, Process: &specs.Process{
		Args: []string{"sleep", "3600"}, Cwd: "/", Env: []string{"PATH=/bin", "HOSTNAME=misc"}, User: specs.User{UID: uid, GID: gid},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return []restoreArchiveEntry{{name: "config.dump", data: cfg}, {name: "spec.dump", data: spec},
		{name: "deleted.files", data: []byte("[]")}, {name: "checkpoint/inventory.img", data: []byte("x")}}
}

// restoreTar is a tar holding one file, name, with data.
func restoreTar(t *testing.T, name, data string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: int64(len(data)), Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCheckpointRestoreDistrustsTheArchive gives CreateContainer (image =
// a local archive, KEP-2008's restore) hostile checkpoint archives: one
// whose process ran as root when the request says runAsUser 1000 (the
// kubelet and admission decided on the request's identity), one with a
// sparse entry that reads as 256 MiB of zeros from a few hundred bytes,
// and one whose rootfs-diff.tar is a symlink to a host file. Each is
// InvalidArgument, refused for that reason, and leaves nothing behind
// (issue 34, finding 9).
func TestCheckpointRestoreDistrustsTheArchive(t *testing.T) {
	p := newMiscPod(t, nil)
	st, err := p.d.Image.ImageStatus(berthdtest.Ctx(t), &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: p.reg.Ref("busybox:latest")}})
	if err != nil || st.Image == nil {
		t.Fatalf("ImageStatus: %v", err)
	}
	// A host file that happens to be a tar (a backup, another
	// container's checkpoint): replayed into the container, it would hand
	// the container its content.
	hostFile := filepath.Join(t.TempDir(), "host.tar")
	if err := os.WriteFile(hostFile, restoreTar(t, "stolen", "not yours\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	diff := restoreArchiveEntry{name: "rootfs-diff.tar", data: restoreTar(t, "tmp/restored", "ok\n")}
	for _, tc := range []struct {
		name    string
		entries []restoreArchiveEntry
		want    string
	}{
		{"root instead of runAsUser", append(restoreDumps(t, st.Image.Id, 0, 0), diff), "runs as uid 0"},
		{"sparse entry", append(restoreDumps(t, st.Image.Id, 1000, 1000), diff,
			restoreArchiveEntry{name: "checkpoint/pages-1.img", sparse: 256 << 20}), "sparse"},
		{"symlinked rootfs diff", append(restoreDumps(t, st.Image.Id, 1000, 1000),
			restoreArchiveEntry{name: "rootfs-diff.tar", link: hostFile}), "only directories and regular files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			archive := restoreArchive(t, t.TempDir(), tc.entries)
			cfg := p.config(strings.ReplaceAll(tc.name, " ", "-"), "")
			cfg.Image = &criapi.ImageSpec{Image: archive}
			cfg.Linux.SecurityContext.RunAsUser = &criapi.Int64Value{Value: 1000}
			cfg.Linux.SecurityContext.RunAsGroup = &criapi.Int64Value{Value: 1000}
			id, err := p.create(cfg)
			if err == nil {
				resp, _ := p.d.Runtime.ContainerStatus(berthdtest.Ctx(t), &criapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
				t.Fatalf("CreateContainer restored the hostile archive: %v", resp.GetStatus())
			}
			t.Logf("refused: %v", err)
			berthdtest.WantCode(t, err, codes.InvalidArgument)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("refused for another reason than %q: %v", tc.want, err)
			}
			// The unpacked checkpoint goes with the failed call.
			if es, _ := os.ReadDir(filepath.Join(p.d.Root, "checkpoints")); len(es) != 0 {
				t.Fatalf("left in %s: %v", filepath.Join(p.d.Root, "checkpoints"), es)
			}
		})
	}
}
