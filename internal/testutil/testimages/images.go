// Package testimages builds small OCI images from the host's busybox-static
// binary and serves them from an in-process registry on loopback, so that
// tests never need the internet.
package testimages

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BusyboxPath is where Debian's busybox-static installs the binary.
const BusyboxPath = "/bin/busybox"

// Applets get a /bin symlink to busybox in every image.
var Applets = []string{
	"sh", "ash", "sleep", "cat", "echo", "ls", "id", "env", "true", "false",
	"touch", "mkdir", "rm", "cp", "mv", "ln", "head", "tail", "wc", "grep",
	"sed", "awk", "printf", "test", "[", "kill", "ps", "top", "mount", "umount",
	"hostname", "date", "dd", "yes", "seq", "nc", "wget", "httpd", "stat",
	"chmod", "chown", "whoami", "nslookup", "ip", "ifconfig", "ping", "du", "df",
	"tr", "cut", "sort", "uniq", "xargs", "find", "readlink", "realpath", "tee",
	"usleep", "timeout", "nproc", "free", "uname", "basename", "dirname", "pwd",
	"md5sum", "sha256sum", "base64", "od", "hexdump", "diff", "cmp", "which",
	"setsid", "nohup", "sync", "more", "less", "vi", "watch", "pidof", "pgrep", "pkill",
}

// UID and GID of the non-root user the images know by name.
const (
	TestUser  = "berthuser"
	TestUID   = 1000
	TestGroup = "berthgroup"
	TestGID   = 1000
	// ExtraGID is a supplementary group TestUser belongs to in /etc/group.
	ExtraGID = 2000
)

// File is one entry of a layer built in memory.
type File struct {
	Name     string
	Mode     int64
	Data     []byte
	Dir      bool
	Symlink  string // target, for a symlink
	Hardlink string // target path, for a hard link
	UID, GID int
}

var mtime = time.Unix(1700000000, 0)

// Layer builds an uncompressed tar of files as an image layer.
func Layer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: mtime, Uid: f.UID, Gid: f.GID, Format: tar.FormatPAX}
		switch {
		case f.Dir:
			h.Typeflag = tar.TypeDir
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case f.Symlink != "":
			h.Typeflag = tar.TypeSymlink
			h.Linkname = f.Symlink
			h.Mode = 0o777
		case f.Hardlink != "":
			h.Typeflag = tar.TypeLink
			h.Linkname = f.Hardlink
		default:
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.Data))
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header %s: %w", f.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("tar data %s: %w", f.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

var (
	baseOnce  sync.Once
	baseFiles []File
	baseErr   error
)

// BaseFiles is the busybox root filesystem: /bin/busybox with applet
// symlinks, /etc/passwd and /etc/group naming TestUser, /tmp, /root.
func BaseFiles() ([]File, error) {
	baseOnce.Do(func() {
		bb, err := os.ReadFile(BusyboxPath)
		if err != nil {
			baseErr = fmt.Errorf("read %s (install busybox-static): %w", BusyboxPath, err)
			return
		}
		files := []File{
			{Name: "bin", Dir: true},
			{Name: "bin/busybox", Mode: 0o755, Data: bb},
			{Name: "etc", Dir: true},
			{Name: "etc/passwd", Data: []byte(fmt.Sprintf(
				"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n%s:x:%d:%d:berth test user:/home/%s:/bin/sh\n",
				TestUser, TestUID, TestGID, TestUser))},
			{Name: "etc/group", Data: []byte(fmt.Sprintf(
				"root:x:0:\nnogroup:x:65534:\n%s:x:%d:\nberthextra:x:%d:%s\n",
				TestGroup, TestGID, ExtraGID, TestUser))},
			{Name: "tmp", Dir: true, Mode: 0o1777},
			{Name: "root", Dir: true, Mode: 0o700},
			{Name: "home", Dir: true},
			{Name: fmt.Sprintf("home/%s", TestUser), Dir: true, UID: TestUID, GID: TestGID},
			{Name: "proc", Dir: true}, {Name: "sys", Dir: true}, {Name: "dev", Dir: true},
			{Name: "var", Dir: true}, {Name: "run", Dir: true},
		}
		for _, a := range Applets {
			files = append(files, File{Name: "bin/" + a, Symlink: "busybox"})
		}
		baseFiles = files
	})
	return baseFiles, baseErr
}

// Busybox is a one-layer busybox image whose command is sh.
func Busybox() (v1.Image, error) {
	return build(nil, v1.Config{Cmd: []string{"sh"}})
}

// BusyboxUser runs as TestUser by name (USER berthuser).
func BusyboxUser() (v1.Image, error) {
	return build(nil, v1.Config{Cmd: []string{"sh"}, User: TestUser})
}

// BusyboxUID runs as a numeric UID:GID (USER 1000:1000).
func BusyboxUID() (v1.Image, error) {
	return build(nil, v1.Config{Cmd: []string{"sh"}, User: fmt.Sprintf("%d:%d", TestUID, TestGID)})
}

// HTTPDPort is the port the web-server image listens on.
const HTTPDPort = 80

// HTTPDIndex is the page the web-server image serves at /.
const HTTPDIndex = "hello from berth httpd\n"

// HTTPD serves /www with busybox httpd in the foreground on HTTPDPort.
func HTTPD() (v1.Image, error) {
	www := []File{{Name: "www", Dir: true}, {Name: "www/index.html", Data: []byte(HTTPDIndex)}}
	return build([][]File{www}, v1.Config{
		Entrypoint:   []string{"/bin/httpd"},
		Cmd:          []string{"-f", "-p", fmt.Sprint(HTTPDPort), "-h", "/www"},
		ExposedPorts: map[string]struct{}{fmt.Sprintf("%d/tcp", HTTPDPort): {}},
	})
}

// MultiLayer has the busybox layer plus three more: one adds files, one
// deletes one of them (whiteout), one replaces a directory (opaque).
func MultiLayer() (v1.Image, error) {
	add := []File{
		{Name: "data", Dir: true},
		{Name: "data/keep", Data: []byte("keep\n")},
		{Name: "data/gone", Data: []byte("gone\n")},
		{Name: "opaque", Dir: true},
		{Name: "opaque/old", Data: []byte("old\n")},
		{Name: "data/link", Symlink: "keep"},
		{Name: "data/hard", Hardlink: "data/keep"},
	}
	del := []File{{Name: "data", Dir: true}, {Name: "data/.wh.gone"}}
	opq := []File{
		{Name: "opaque", Dir: true},
		{Name: "opaque/.wh..wh..opq"},
		{Name: "opaque/new", Data: []byte("new\n")},
	}
	return build([][]File{add, del, opq}, v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin", "LAYERS=4"}})
}

// Build is the busybox base with extra layers on top and config cfg
// (PATH is set when cfg has no Env), for images a test assembles itself.
func Build(extra [][]File, cfg v1.Config) (v1.Image, error) { return build(extra, cfg) }

// build stacks the base layer and extra layers with the given config.
func build(extra [][]File, cfg v1.Config) (v1.Image, error) {
	base, err := BaseFiles()
	if err != nil {
		return nil, err
	}
	layers := make([]v1.Layer, 0, 1+len(extra))
	for _, files := range append([][]File{base}, extra...) {
		l, err := Layer(files)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	if len(cfg.Env) == 0 {
		cfg.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = runtime.GOARCH
	cf.OS = "linux"
	cf.Config = cfg
	cf.Created = v1.Time{Time: mtime}
	return mutate.ConfigFile(img, cf)
}

// Must is for tests: it fails t when building an image fails.
func Must(t testing.TB, img v1.Image, err error) v1.Image {
	t.Helper()
	if err != nil {
		t.Fatalf("build test image: %v", err)
	}
	return img
}

// OtherArch is the architecture MultiArch's decoy image claims: one that is
// never this machine's.
func OtherArch() string {
	if runtime.GOARCH == "s390x" {
		return "ppc64le"
	}
	return "s390x"
}

// MultiArch is an OCI image index with a decoy image for linux/OtherArch()
// first and the busybox image for linux/GOARCH second. It returns the index
// and the native image.
func MultiArch() (v1.ImageIndex, v1.Image, error) {
	native, err := build(nil, v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin", "ARCH=native"}})
	if err != nil {
		return nil, nil, err
	}
	decoy, err := build(nil, v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin", "ARCH=decoy"}})
	if err != nil {
		return nil, nil, err
	}
	cf, err := decoy.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = OtherArch()
	if decoy, err = mutate.ConfigFile(decoy, cf); err != nil {
		return nil, nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.AppendManifests(idx,
		mutate.IndexAddendum{Add: decoy, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: OtherArch()}}},
		mutate.IndexAddendum{Add: native, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	return idx, native, nil
}
