// Command registry serves, on loopback, stand-ins for the images the
// Kubernetes node e2e suite pulls ([NodeConformance] specs), built from the
// host's busybox-static, bash, the real agnhost binary (hack/k8s-bins.sh)
// and imagetools (nmeter, nnp, pause), the sample device plugin
// (hack/k8s-bins.sh sample-device-plugin). make e2e-node (hack/e2e-node.sh)
// points berthd's registry mirrors for registry.k8s.io, gcr.io, docker.io
// and quay.io at it; make e2e-cluster (hack/e2e-cluster.sh) does the same
// for its nodes, and adds CoreDNS (-coredns). A test fixture, not part of
// berth.
//
//	registry -addr 127.0.0.1:0 -agnhost /path/agnhost -imagetools /path/imagetools \
//		-porter-dir DIR -sample-device-plugin /path/sample-device-plugin [-coredns /path/coredns] \
//		[-sample-apiserver /path/sample-apiserver] [-etcd /path/etcd]
//
// prints "listening HOST:PORT", one "pushed REF DIGEST" per image, then
// READY, and serves until killed.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/berthcri/berth/internal/testutil/testimages"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	agnhost := flag.String("agnhost", "", "the agnhost binary (hack/k8s-bins.sh agnhost)")
	tools := flag.String("imagetools", "", "the imagetools binary (test/e2enode/imagetools, static)")
	porter := flag.String("porter-dir", "", "directory with agnhost's porter/localhost.crt and localhost.key (from the k8s.io/kubernetes module)")
	sdp := flag.String("sample-device-plugin", "", "the sample device plugin binary (hack/k8s-bins.sh sample-device-plugin)")
	coredns := flag.String("coredns", "", "optional: the CoreDNS binary (hack/k8s-bins.sh coredns), served as "+corednsRef)
	sampleAPIServer := flag.String("sample-apiserver", "", "optional: the sample-apiserver binary (hack/k8s-bins.sh sample-apiserver), served as "+sampleAPIServerRef)
	etcd := flag.String("etcd", "", "optional: the etcd binary (hack/k8s-bins.sh etcd), served as "+etcdRef)
	flag.Parse()
	if *agnhost == "" || *tools == "" || *porter == "" || *sdp == "" {
		log.Fatal("need -agnhost, -imagetools, -porter-dir and -sample-device-plugin")
	}
	imgs, err := images(sources{agnhost: *agnhost, tools: *tools, porter: *porter, devicePlugin: *sdp, coredns: *coredns,
		sampleAPIServer: *sampleAPIServer, etcd: *etcd})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	host := ln.Addr().String()
	fmt.Println("listening", host)
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(os.Stderr, "registry: ", log.LstdFlags))), ReadHeaderTimeout: 10 * time.Second}
	go func() { log.Fatal(srv.Serve(ln)) }()

	refs := make([]string, 0, len(imgs))
	for r := range imgs {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	for _, r := range refs {
		ref, err := name.ParseReference(host+"/"+r, name.Insecure)
		if err != nil {
			log.Fatal(err)
		}
		if err := remote.Write(ref, imgs[r]); err != nil {
			log.Fatalf("push %s: %v", r, err)
		}
		d, err := imgs[r].Digest()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("pushed", r, d)
	}
	fmt.Println("READY")
	select {}
}

type sources struct {
	agnhost, tools, porter, devicePlugin, coredns string
	sampleAPIServer, etcd                         string
}

// corednsRef is where the -coredns image is served (under registry.k8s.io
// as kubeadm pulls it); make e2e-cluster runs the cluster DNS from it.
const corednsRef = "coredns/coredns:v1.15.0"

// sampleAPIServerRef and etcdRef are the cluster suite's Aggregator spec's
// images (-sample-apiserver, -etcd): upstream's sample-apiserver 1.29.2
// stands for the k8s.io/sample-apiserver module of the pinned release,
// and its etcd 3.7.0-0 for the etcd test/k8s/etcd pins.
const (
	sampleAPIServerRef = "e2e-test-images/sample-apiserver:1.29.2"
	etcdRef            = "etcd:3.7.0-0"
)

const path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

const passwd = `root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
`

const group = `root:x:0:
daemon:x:1:
bin:x:2:
www-data:x:33:
users:x:100:
nogroup:x:65534:
`

// agnhostOSRelease is the stand-in agnhost's /etc/os-release: a busybox
// base standing in for upstream's Alpine one, and saying so.
const agnhostOSRelease = `NAME="berth stand-in for agnhost (upstream base: Alpine Linux)"
ID=berth-stand-in
PRETTY_NAME="berth stand-in for agnhost: busybox base (upstream base: Alpine Linux)"
`

// images maps repository:tag (as under registry.k8s.io, gcr.io or
// docker.io) to its stand-in.
func images(src sources) (map[string]v1.Image, error) {
	tools, err := os.ReadFile(src.tools)
	if err != nil {
		return nil, err
	}
	base, err := baseLayer(passwd, group, tools, false)
	if err != nil {
		return nil, err
	}
	b := &builder{src: src, tools: tools, base: base, imgs: map[string]v1.Image{}}
	// pause comes before agnhost, which serves it from its fake registry.
	for _, build := range []func() error{b.busybox, b.pause, b.agnhost, b.webServers, b.nonewprivsAndNonroot,
		b.glibcDNSTesting, b.sampleDevicePlugin, b.coreDNS, b.aggregator} {
		if err := build(); err != nil {
			return nil, err
		}
	}
	return b.imgs, nil
}

// builder builds the stand-ins, one family of images per method, into
// imgs.
type builder struct {
	src   sources
	tools []byte   // the imagetools binary
	base  v1.Layer // the busybox base, sh being imagetools
	imgs  map[string]v1.Image
}

// add(refs...)(image(...)) stores one image under several names.
func (b *builder) add(refs ...string) func(v1.Image, error) error {
	return func(img v1.Image, err error) error {
		if err != nil {
			return fmt.Errorf("build %s: %w", refs[0], err)
		}
		for _, r := range refs {
			b.imgs[r] = img
		}
		return nil
	}
}

// busybox: the base as it is.
func (b *builder) busybox() error {
	sh := v1.Config{Cmd: []string{"sh"}}
	return b.add("e2e-test-images/busybox:1.37.0-2", "e2e-test-images/busybox:1.37.0-1", "e2e-test-images/busybox:1.36.1-1",
		"e2e-test-images/busybox:1.36.1-2", "e2e-test-images/busybox:1.29-4", "e2e-test-images/busybox:1.29-2",
		"e2e-test-images/busybox:1.29", "library/busybox:latest", "library/busybox:1.28", "library/busybox:1.29",
		"library/busybox:1.36", "library/busybox:1.37")(image(sh, b.base))
}

// pause: sleeps until told to stop.
func (b *builder) pause() error {
	pause, err := testimages.Layer([]testimages.File{{Name: "pause", Mode: 0o755, Data: b.tools}})
	if err != nil {
		return err
	}
	return b.add("pause:3.10.2", "pause:3.10.1", "pause:3.10", "pause:3.9", "pause:3.8")(image(v1.Config{Entrypoint: []string{"/pause"}}, pause))
}

// agnhost, and kitten and nautilus, which are agnhost with pictures.
func (b *builder) agnhost() error {
	agBase, agLayer, err := b.agnhostLayers()
	if err != nil {
		return err
	}
	ports := map[string]struct{}{}
	for _, p := range []string{"80", "8080", "8081", "9376", "5000"} {
		ports[p+"/tcp"] = struct{}{}
	}
	if err := b.add("e2e-test-images/agnhost:2.66.1", "e2e-test-images/agnhost:2.56", "e2e-test-images/agnhost:2.55", "e2e-test-images/agnhost:2.53")(image(v1.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, ExposedPorts: ports}, agBase, agLayer)); err != nil {
		return err
	}
	// kitten and nautilus (the cluster suite's update-demo and rollout
	// specs): upstream's Dockerfiles put the picture and data.json of
	// test/images/<name>/html in agnhost's / and run its test-webserver,
	// which serves /. The porter dir is test/images/agnhost/porter of the
	// same module.
	for _, pic := range []string{"kitten", "nautilus"} {
		html := filepath.Join(b.src.porter, "..", "..", pic, "html")
		jpg, err := os.ReadFile(filepath.Join(html, pic+".jpg"))
		if err != nil {
			return err
		}
		data, err := os.ReadFile(filepath.Join(html, "data.json"))
		if err != nil {
			return err
		}
		l, err := testimages.Layer([]testimages.File{{Name: pic + ".jpg", Mode: 0o644, Data: jpg}, {Name: "data.json", Mode: 0o644, Data: data}})
		if err != nil {
			return err
		}
		if err := b.add("e2e-test-images/" + pic + ":1.8")(image(v1.Config{Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}, ExposedPorts: ports}, agBase, agLayer, l)); err != nil {
			return err
		}
	}
	return nil
}

// agnhostLayers are agnhost's as upstream's Dockerfile builds it: /agnhost
// and the agnhost-2 link (entrypoint-tester), porter's certificate and key
// in / (HTTPS lifecycle hooks), /uploads (netexec), the user and group
// defined in the image (supplemental groups specs), curl and nc, bash (as
// /bin/sh: see baseLayer).
func (b *builder) agnhostLayers() (agBase, agLayer v1.Layer, err error) {
	ag, err := os.ReadFile(b.src.agnhost)
	if err != nil {
		return nil, nil, err
	}
	crt, err := os.ReadFile(filepath.Join(b.src.porter, "localhost.crt"))
	if err != nil {
		return nil, nil, err
	}
	key, err := os.ReadFile(filepath.Join(b.src.porter, "localhost.key"))
	if err != nil {
		return nil, nil, err
	}
	agBase, err = baseLayer(passwd+"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
		group+"user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n", b.tools, true)
	if err != nil {
		return nil, nil, err
	}
	// /var/registry: what `agnhost fake-registry-server` serves (the
	// credential provider spec pulls pause:testing from it), in the
	// layout of upstream's prepare_registry.sh: pause:3.10.2 as "testing".
	regFiles, err := registryDir(b.imgs["pause:3.10.2"], "pause", "testing")
	if err != nil {
		return nil, nil, err
	}
	agLayer, err = testimages.Layer(append([]testimages.File{
		{Name: "agnhost", Mode: 0o755, Data: ag},
		{Name: "agnhost-2", Symlink: "agnhost"},
		{Name: "localhost.crt", Mode: 0o644, Data: crt},
		{Name: "localhost.key", Mode: 0o600, Data: key},
		{Name: "uploads", Dir: true},
		{Name: "home/user-defined-in-image", Dir: true, UID: 1000, GID: 1000},
		// curl and netcat (with -u) as upstream's image has them: the
		// framework's node-to-pod checks run them in a host-network pod.
		{Name: "usr/bin/curl", Symlink: "/bin/imagetools"},
		{Name: "usr/bin/nc", Symlink: "/bin/imagetools"},
		// dig and getent (upstream: Alpine's bind-tools and musl's
		// getent): the cluster suite's DNS specs run them in the "musl
		// querier" (make e2e-cluster).
		{Name: "usr/bin/dig", Symlink: "/bin/imagetools"},
		{Name: "usr/bin/getent", Symlink: "/bin/imagetools"},
		// /etc/os-release naming upstream's base (Alpine): the cluster
		// suite's ImageVolume spec reads it through an image volume of
		// kitten, which is agnhost plus its pictures, and looks for
		// "Alpine Linux". It says what this image is.
		{Name: "etc/os-release", Mode: 0o644, Data: []byte(agnhostOSRelease)},
	}, regFiles...))
	if err != nil {
		return nil, nil, err
	}
	return agBase, agLayer, nil
}

// nginx and httpd: a web server on port 80 (busybox httpd), pid file
// where nginx keeps it.
func (b *builder) webServers() error {
	www, err := testimages.Layer([]testimages.File{
		{Name: "usr/share/nginx/html", Dir: true},
		{Name: "usr/share/nginx/html/index.html", Data: []byte("<html><body><h1>Welcome to nginx!</h1></body></html>\n")},
		{Name: "usr/local/apache2/htdocs", Dir: true},
		{Name: "usr/local/apache2/htdocs/index.html", Data: []byte("<html><body><h1>It works!</h1></body></html>\n")},
	})
	if err != nil {
		return err
	}
	web := func(root string) v1.Config {
		return v1.Config{Cmd: []string{"httpd", "-f", "-p", "80", "-h", root}, ExposedPorts: map[string]struct{}{"80/tcp": {}}}
	}
	if err := b.add("e2e-test-images/nginx:1.28.0-2", "e2e-test-images/nginx:1.27.0-2", "e2e-test-images/nginx:1.14-4", "e2e-test-images/nginx:1.15-4", "e2e-test-images/nginx:1.14-2", "library/nginx:latest")(image(web("/usr/share/nginx/html"), b.base, www)); err != nil {
		return err
	}
	return b.add("e2e-test-images/httpd:2.4.38-4", "e2e-test-images/httpd:2.4.39-4", "library/httpd:latest")(image(web("/usr/local/apache2/htdocs"), b.base, www))
}

// nonewprivs, a setuid-root program printing its effective uid, and
// nonroot, USER 1234.
func (b *builder) nonewprivsAndNonroot() error {
	nnp, err := testimages.Layer([]testimages.File{
		{Name: "usr/local/bin/nnp", Mode: 0o4755, Data: b.tools},
	})
	if err != nil {
		return err
	}
	if err := b.add("e2e-test-images/nonewprivs:1.4", "e2e-test-images/nonewprivs:1.3")(image(v1.Config{Cmd: []string{"nnp"}}, b.base, nnp)); err != nil {
		return err
	}
	return b.add("e2e-test-images/nonroot:1.5", "e2e-test-images/nonroot:1.4")(image(v1.Config{Cmd: []string{"sh"}, User: "1234"}, b.base))
}

// glibcDNSTesting is glibc-dns-testing (Debian bookworm-slim with
// dnsutils upstream): the Hostname specs run `sh -c 'echo
// $(hostname)";"$(hostname -f)";"'` in it, so glibc's hostname, Debian's,
// run by bash, resolving with /etc/hosts first as Debian's nsswitch.conf
// has it. The cluster suite's DNS specs run dig and `getent hosts` in it
// (the "glibc querier"): glibc's getent, Debian's (glibc 2.34+ has its
// files and dns NSS modules built in), and imagetools' dig for dnsutils'.
// The upstream image's coredns is left out: no spec runs it.
func (b *builder) glibcDNSTesting() error {
	glBase, err := baseLayer(passwd, group, b.tools, true)
	if err != nil {
		return err
	}
	hn, err := hostProgram("/bin/hostname", "bin/hostname")
	if err != nil {
		return fmt.Errorf("glibc-dns-testing (install hostname): %w", err)
	}
	ge, err := hostProgram("/usr/bin/getent", "usr/bin/getent")
	if err != nil {
		return fmt.Errorf("glibc-dns-testing (getent, libc-bin): %w", err)
	}
	glLayer, err := testimages.Layer(append(append(hn, ge...),
		testimages.File{Name: "usr/bin/dig", Symlink: "/bin/imagetools"},
		testimages.File{Name: "etc/nsswitch.conf", Data: []byte("passwd: files\ngroup: files\nhosts: files dns\n")}))
	if err != nil {
		return err
	}
	return b.add("e2e-test-images/glibc-dns-testing:2.1.1")(image(v1.Config{Cmd: []string{"bash"}}, glBase, glLayer))
}

// sampleDevicePlugin: upstream's Dockerfile adds the plugin, built from
// the same module, as /sampledeviceplugin to Alpine; the busybox base
// stands in for Alpine (the Device Plugin specs run only the plugin in
// it).
func (b *builder) sampleDevicePlugin() error {
	dp, err := os.ReadFile(b.src.devicePlugin)
	if err != nil {
		return err
	}
	dpLayer, err := testimages.Layer([]testimages.File{{Name: "sampledeviceplugin", Mode: 0o755, Data: dp}})
	if err != nil {
		return err
	}
	return b.add("e2e-test-images/sample-device-plugin:1.8.0", "e2e-test-images/sample-device-plugin:1.7")(image(v1.Config{Entrypoint: []string{"/sampledeviceplugin", "-alsologtostderr"}}, b.base, dpLayer))
}

// coreDNS, with -coredns: the binary alone, as upstream's image
// (distroless) has little else; it runs as root to bind port 53.
func (b *builder) coreDNS() error {
	if b.src.coredns == "" {
		return nil
	}
	cd, err := os.ReadFile(b.src.coredns)
	if err != nil {
		return err
	}
	cdLayer, err := testimages.Layer([]testimages.File{{Name: "coredns", Mode: 0o755, Data: cd}})
	if err != nil {
		return err
	}
	return b.add(corednsRef)(image(v1.Config{Entrypoint: []string{"/coredns"}, ExposedPorts: map[string]struct{}{"53/tcp": {}, "53/udp": {}}}, cdLayer))
}

// aggregator is the Aggregator spec's, each with its flag: the
// sample-apiserver binary as /sample-apiserver (upstream's Dockerfile) on
// the busybox base; etcd as /usr/local/bin/etcd, where the spec's command
// runs it.
func (b *builder) aggregator() error {
	for _, bin := range []struct{ ref, src, dest string }{
		{sampleAPIServerRef, b.src.sampleAPIServer, "sample-apiserver"},
		{etcdRef, b.src.etcd, "usr/local/bin/etcd"},
	} {
		if bin.src == "" {
			continue
		}
		data, err := os.ReadFile(bin.src)
		if err != nil {
			return err
		}
		l, err := testimages.Layer([]testimages.File{{Name: bin.dest, Mode: 0o755, Data: data}})
		if err != nil {
			return err
		}
		if err := b.add(bin.ref)(image(v1.Config{Entrypoint: []string{"/" + bin.dest}}, b.base, l)); err != nil {
			return err
		}
	}
	return nil
}

// registryDir is var/registry/<repo> as agnhost's fake-registry-server
// reads it: manifests/<tag> holding the manifest's digest, manifests and
// blobs at <kind>/sha256/<2 hex>/<hex>/data.
func registryDir(img v1.Image, repo, tag string) ([]testimages.File, error) {
	if img == nil {
		return nil, fmt.Errorf("registry dir %s: no image", repo)
	}
	base := "var/registry/" + repo
	dirs := map[string]bool{}
	var files []testimages.File
	put := func(kind string, d v1.Hash, data []byte) {
		dir := fmt.Sprintf("%s/%s/%s/%s/%s", base, kind, d.Algorithm, d.Hex[:2], d.Hex)
		for x := dir; x != "." && !dirs[x]; x = filepath.Dir(x) {
			dirs[x] = true
		}
		files = append(files, testimages.File{Name: dir + "/data", Mode: 0o644, Data: data})
	}
	man, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	md, err := img.Digest()
	if err != nil {
		return nil, err
	}
	put("manifests", md, man)
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	cd, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	put("blobs", cd, cfg)
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return nil, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
		put("blobs", ld, b)
	}
	files = append(files, testimages.File{Name: base + "/manifests/" + tag, Mode: 0o644, Data: []byte(md.String() + "\n")})
	ds := make([]string, 0, len(dirs))
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	out := make([]testimages.File, 0, len(ds)+len(files))
	for _, d := range ds {
		out = append(out, testimages.File{Name: d, Dir: true})
	}
	return append(out, files...), nil
}

// baseLayer is a busybox root filesystem: every applet of the host's
// busybox-static linked in /bin, except sh, nmeter (imagetools),
// /etc/passwd and /etc/group as given. sh is imagetools (busybox's ash,
// but `sh -c env` keeps the environment names ash drops:
// imagetools/shenv.go), or with bash set, the host's bash and the
// libraries it loads: this busybox's ash runs its own applets before
// programs on PATH (nc, which agnhost's netcat stand-in must replace),
// where upstream's agnhost image (Alpine) finds them on PATH.
func baseLayer(passwd, group string, tools []byte, bash bool) (v1.Layer, error) {
	bb, err := os.ReadFile(testimages.BusyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read busybox (install busybox-static): %w", err)
	}
	files := []testimages.File{}
	for _, d := range []string{"bin", "dev", "etc", "home", "proc", "root", "sys", "usr", "usr/bin", "usr/sbin", "usr/local", "usr/local/bin", "var", "var/run", "run"} {
		files = append(files, testimages.File{Name: d, Dir: true})
	}
	files = append(files,
		testimages.File{Name: "tmp", Dir: true, Mode: 0o1777},
		testimages.File{Name: "bin/busybox", Mode: 0o755, Data: bb},
		testimages.File{Name: "bin/imagetools", Mode: 0o755, Data: tools},
		testimages.File{Name: "etc/passwd", Data: []byte(passwd)},
		testimages.File{Name: "etc/group", Data: []byte(group)},
		testimages.File{Name: "etc/hostname", Data: []byte("localhost\n")},
	)
	out, err := exec.Command(testimages.BusyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || a == "sh" {
			continue
		}
		files = append(files, testimages.File{Name: "bin/" + a, Symlink: "busybox"})
	}
	files = append(files, testimages.File{Name: "bin/nmeter", Symlink: "imagetools"})
	if !bash {
		files = append(files, testimages.File{Name: "bin/sh", Symlink: "imagetools"})
		return testimages.Layer(files)
	}
	b, err := hostProgram("/bin/bash", "bin/bash")
	if err != nil {
		return nil, err
	}
	files = append(files, b...)
	files = append(files, testimages.File{Name: "bin/sh", Symlink: "bash"})
	return testimages.Layer(files)
}

// hostProgram is a dynamically linked host program at dest with the
// shared libraries ldd names, each at its host path.
func hostProgram(src, dest string) ([]testimages.File, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, err
	}
	files := []testimages.File{{Name: dest, Mode: 0o755, Data: data}}
	out, err := exec.Command("ldd", src).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", src, err)
	}
	dirs := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		var lib string
		if f := strings.Fields(line); len(f) >= 3 && f[1] == "=>" {
			lib = f[2]
		} else if len(f) >= 1 && strings.HasPrefix(f[0], "/") {
			lib = f[0]
		}
		if lib == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(real)
		if err != nil {
			return nil, err
		}
		// /lib may be a link to usr/lib on the host: store under the path
		// as named, creating its directories.
		rel := strings.TrimPrefix(lib, "/")
		for d := filepath.Dir(rel); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			files = append([]testimages.File{{Name: d, Dir: true}}, files...)
		}
		files = append(files, testimages.File{Name: rel, Mode: 0o755, Data: b})
	}
	sort.SliceStable(files, func(i, j int) bool { return files[i].Dir && !files[j].Dir })
	return files, nil
}

// image stacks layers with cfg into an OCI image for this machine.
func image(cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	if len(cfg.Env) == 0 {
		cfg.Env = []string{path}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = runtime.GOARCH
	cf.OS = "linux"
	cf.Config = cfg
	cf.Created = v1.Time{Time: time.Unix(1700000000, 0)}
	return mutate.ConfigFile(img, cf)
}
