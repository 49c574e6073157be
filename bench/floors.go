package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/network"
	"github.com/berthcri/berth/internal/oci"
	"github.com/berthcri/berth/internal/oci/ocicli"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/bundletest"
)

// Floor is the cost of what any runtime must do for a step, measured with
// the tools themselves and no runtime around them: the least a CRI call
// can take on this machine. A floor runs in the same loop as its workload,
// one sample after each endpoint's, so machine drift hits it alike.
type Floor struct {
	Name string
	// Bounds is the series key (within the workload) the floor bounds.
	Bounds   string
	Setup    func(ctx context.Context) (any, error)
	Sample   func(ctx context.Context, state any, i int) (time.Duration, error)
	Teardown func(ctx context.Context, state any)
}

// Floors are the floors of the standard workloads.
type Floors struct {
	NetnsCNI, RuncStart, RuncExec, TarExtract *Floor
	// PodStart bounds a pod's start end to end: netns + CNI ADD, then
	// runc create + start of the very spec berth writes.
	PodStart *Floor
}

// NewFloors builds the floors on berth's own configuration (bridge,
// subnet, CNI plugins), the spec berth writes for a container of image
// and the layers of the multi-layer image. A floor that cannot run here
// (no bridge plugin, no tar) is nil.
func NewFloors(tb testing.TB, d *berthdtest.Daemon, image string, multiLayer v1.Image) *Floors {
	tb.Helper()
	f := &Floors{}
	if nf, err := netnsCNIFloor(d); err != nil {
		tb.Logf("no netns + CNI floor: %v", err)
	} else {
		f.NetnsCNI = nf
	}
	rs, re, err := runcFloors(tb)
	if err != nil {
		tb.Logf("no runc floors: %v", err)
	} else {
		f.RuncStart, f.RuncExec = rs, re
	}
	if pf, err := podStartFloor(tb, d, image); err != nil {
		tb.Logf("no pod start floor: %v", err)
	} else {
		f.PodStart = pf
	}
	if tf, err := tarFloor(tb, multiLayer); err != nil {
		tb.Logf("no tar floor: %v", err)
	} else {
		f.TarExtract = tf
	}
	return f
}

// netnsCNIFloor is `ip netns add` plus the bridge plugin's ADD with berth's
// own default network config: what every CNI pod costs before the runtime
// does anything of its own. Each sample's netns is torn down untimed.
func netnsCNIFloor(d *berthdtest.Daemon) (*Floor, error) {
	cniBin, err := FindCNIBin(d.Config.CNIBinDirs)
	if err != nil {
		return nil, err
	}
	ipamDir := filepath.Join(d.Root, "cni", "networks")
	conf, err := BridgePluginConf(network.DefaultConfList(d.Config.DefaultNetwork.Bridge, d.Config.DefaultNetwork.Subnet, ipamDir))
	if err != nil {
		return nil, err
	}
	type live struct{ ns, id string }
	down := func(l live) {
		RunBridgePlugin(cniBin, "DEL", l.id, "/run/netns/"+l.ns, conf)
		_ = exec.Command("ip", "netns", "del", l.ns).Run()
	}
	return &Floor{
		Name: "ip netns add + bridge ADD", Bounds: "RunPodSandbox",
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			l := live{ns: fmt.Sprintf("berthfloor-%d-%d", os.Getpid(), i), id: fmt.Sprintf("floor%d%d", os.Getpid(), i)}
			start := time.Now()
			if out, err := exec.CommandContext(ctx, "ip", "netns", "add", l.ns).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("ip netns add: %v: %s", err, out)
			}
			out, err := RunBridgePlugin(cniBin, "ADD", l.id, "/run/netns/"+l.ns, conf)
			took := time.Since(start)
			down(l)
			if err != nil {
				return 0, fmt.Errorf("bridge ADD: %v: %s", err, out)
			}
			return took, nil
		},
	}, nil
}

// podStartFloor is what starting a kubelet-shaped pod costs any runtime:
// `ip netns add` and the bridge plugin's ADD with berth's network config,
// then `runc create` + `runc start` of the spec berth wrote for the same
// container in a pod of the same shape (its rootfs, mounts and namespaces,
// the network namespace swapped for the floor's own). Its Setup starts
// that pod on berth once, to read the spec and keep the rootfs mounted;
// each sample's netns, attachment and container are removed untimed.
func podStartFloor(tb testing.TB, d *berthdtest.Daemon, image string) (*Floor, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("runc needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, err
	}
	cniBin, err := FindCNIBin(d.Config.CNIBinDirs)
	if err != nil {
		return nil, err
	}
	ipamDir := filepath.Join(d.Root, "cni", "networks")
	conf, err := BridgePluginConf(network.DefaultConfList(d.Config.DefaultNetwork.Bridge, d.Config.DefaultNetwork.Subnet, ipamDir))
	if err != nil {
		return nil, err
	}
	dir := tb.TempDir()
	runc := oci.New("runc", filepath.Join(dir, "runc"), nil)
	ep := &Endpoint{Name: "floor", Runtime: d.Runtime, Image: d.Image, Dir: dir}
	type setup struct {
		podID  string
		spec   []byte
		rootfs string
	}
	return &Floor{
		Name: "netns + bridge ADD + runc create + start", Bounds: "RunPodSandbox+CreateContainer+StartContainer",
		Setup: func(ctx context.Context) (any, error) {
			podID, ctrID, err := podWithContainer(ctx, ep, image)
			if err != nil {
				return nil, err
			}
			ctrDir := filepath.Join(d.Root, "containers", ctrID)
			spec, err := os.ReadFile(filepath.Join(ctrDir, "config.json"))
			if err != nil {
				removePod(ctx, ep, podID)
				return nil, err
			}
			return &setup{podID: podID, spec: spec, rootfs: filepath.Join(ctrDir, "rootfs")}, nil
		},
		Sample: func(ctx context.Context, st any, i int) (time.Duration, error) {
			su := st.(*setup)
			ns := fmt.Sprintf("berthfloor-%d-p%d", os.Getpid(), i)
			id := fmt.Sprintf("podfloor%d", i)
			bundle := filepath.Join(dir, "bundles", id)
			if err := podFloorBundle(su.spec, bundle, id, su.rootfs, "/run/netns/"+ns); err != nil {
				return 0, err
			}
			defer func() {
				_ = runc.Delete(ctx, id, true)
				RunBridgePlugin(cniBin, "DEL", id, "/run/netns/"+ns, conf)
				_ = exec.Command("ip", "netns", "del", ns).Run()
				os.RemoveAll(bundle)
			}()
			start := time.Now()
			if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("ip netns add: %v: %s", err, out)
			}
			if out, err := RunBridgePlugin(cniBin, "ADD", id, "/run/netns/"+ns, conf); err != nil {
				return 0, fmt.Errorf("bridge ADD: %v: %s", err, out)
			}
			if err := runc.CLI().Create(ctx, id, ocicli.CreateOpts{Bundle: bundle, PidFile: filepath.Join(bundle, "pid")}); err != nil {
				return 0, err
			}
			if err := runc.CLI().Start(ctx, id); err != nil {
				return 0, err
			}
			return time.Since(start), nil
		},
		Teardown: func(ctx context.Context, st any) {
			removePod(ctx, ep, st.(*setup).podID)
		},
	}, nil
}

// podFloorBundle writes a bundle for id from berth's spec: its own cgroup,
// the given rootfs and network namespace.
func podFloorBundle(data []byte, bundle, id, rootfs, netns string) error {
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	if spec.Linux == nil {
		return errors.New("spec without a linux section")
	}
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = netns
		}
	}
	spec.Linux.CgroupsPath = filepath.Join(filepath.Dir(spec.Linux.CgroupsPath), id)
	spec.Root.Path = rootfs
	out, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), out, 0o600)
}

// runcBundles writes busybox bundles for runc alone, in a private dir and
// cgroup that the test's cleanup removes.
type runcBundles struct {
	dir, rootfs, cgroup string
	runc                *oci.Runtime
}

func (r *runcBundles) create(ctx context.Context, id string, args []string) error {
	bundle := filepath.Join(r.dir, "bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	spec := bundletest.Spec(r.rootfs, r.cgroup, id, args)
	spec.Root.Readonly = true
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return err
	}
	return r.runc.CLI().Create(ctx, id, ocicli.CreateOpts{Bundle: bundle, PidFile: filepath.Join(bundle, "pid")})
}

func (r *runcBundles) remove(ctx context.Context, id string) {
	_ = r.runc.Delete(ctx, id, true)
	os.RemoveAll(filepath.Join(r.dir, "bundles", id))
}

// runcFloors are `runc create` + `runc start` of a sleeping busybox bundle
// (the floor of CreateContainer+StartContainer) and `runc exec` of `true`
// in a running one (the floor of ExecSync).
func runcFloors(tb testing.TB) (start, execFloor *Floor, err error) {
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("runc needs root")
	}
	bin, err := exec.LookPath("runc")
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "berth-bench-floor-")
	if err != nil {
		return nil, nil, err
	}
	r := &runcBundles{dir: dir, rootfs: filepath.Join(dir, "rootfs"), cgroup: "berthfloor-" + filepath.Base(dir)}
	tb.Cleanup(func() {
		if err := berthdtest.CleanupNode(dir, r.cgroup); err != nil {
			tb.Errorf("cleanup runc floors: %v", err)
		}
	})
	bundletest.WriteRootfs(tb, r.rootfs)
	r.runc = oci.New(bin, filepath.Join(dir, "runc"), nil)
	sleep := []string{"sleep", "100000"}
	start = &Floor{
		Name: "runc create + runc start", Bounds: "CreateContainer+StartContainer",
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			id := fmt.Sprintf("start%d", i)
			t0 := time.Now()
			err := r.create(ctx, id, sleep)
			if err == nil {
				err = r.runc.CLI().Start(ctx, id)
			}
			took := time.Since(t0)
			r.remove(ctx, id)
			return took, err
		},
	}
	execFloor = &Floor{
		Name: "runc exec true", Bounds: "ExecSync true",
		Setup: func(ctx context.Context) (any, error) {
			if err := r.create(ctx, "exec", sleep); err != nil {
				r.remove(ctx, "exec")
				return nil, err
			}
			if err := r.runc.CLI().Start(ctx, "exec"); err != nil {
				r.remove(ctx, "exec")
				return nil, err
			}
			return nil, nil
		},
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			proc := &specs.Process{Args: []string{"true"}, Env: []string{"PATH=/bin"}, Cwd: "/"}
			// No terminal and no pipes: the floor is runc's own cost.
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return 0, err
			}
			defer null.Close()
			t0 := time.Now()
			err = r.runc.Exec(ctx, "exec", proc, oci.ExecOpts{Stdin: null, Stdout: null})
			return time.Since(t0), err
		},
		Teardown: func(ctx context.Context, _ any) { r.remove(ctx, "exec") },
	}
	return start, execFloor, nil
}

// tarFloor is GNU `tar -xzf` of the multi-layer image's gzip layers, one
// directory per layer: the floor of pulling it (no network, no digest
// checks, no whiteout handling).
func tarFloor(tb testing.TB, img v1.Image) (*Floor, error) {
	if _, err := exec.LookPath("tar"); err != nil {
		return nil, err
	}
	layers, err := GzipLayers(img)
	if err != nil {
		return nil, err
	}
	work := tb.TempDir()
	files := make([]string, len(layers))
	for i, l := range layers {
		files[i] = filepath.Join(work, fmt.Sprintf("layer%d.tar.gz", i))
		if err := os.WriteFile(files[i], l, 0o644); err != nil {
			return nil, err
		}
	}
	return &Floor{
		Name: fmt.Sprintf("tar -xzf of the %d layers", len(files)), Bounds: "PullImage (4 layers, local registry)",
		Sample: func(ctx context.Context, _ any, i int) (time.Duration, error) {
			dir := filepath.Join(work, fmt.Sprintf("x%d", i))
			defer os.RemoveAll(dir)
			start := time.Now()
			for j, f := range files {
				d := filepath.Join(dir, fmt.Sprint(j))
				if err := os.MkdirAll(d, 0o755); err != nil {
					return 0, err
				}
				if out, err := exec.CommandContext(ctx, "tar", "-xzf", f, "-C", d).CombinedOutput(); err != nil {
					return 0, fmt.Errorf("tar: %v: %s", err, out)
				}
			}
			return time.Since(start), nil
		},
	}, nil
}

// FindCNIBin returns the first of dirs holding the bridge plugin.
func FindCNIBin(dirs []string) (string, error) {
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no bridge CNI plugin in %v", dirs)
}

// BridgePluginConf extracts the bridge plugin from a conflist as a
// stand-alone plugin config (name and cniVersion added, as libcni does).
func BridgePluginConf(list []byte) ([]byte, error) {
	var l struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(list, &l); err != nil {
		return nil, fmt.Errorf("parse conflist: %w", err)
	}
	if len(l.Plugins) == 0 {
		return nil, errors.New("conflist has no plugins")
	}
	p := l.Plugins[0]
	p["cniVersion"], p["name"] = l.CNIVersion, l.Name
	return json.Marshal(p)
}

// RunBridgePlugin runs the bridge plugin from dir with a CNI command.
func RunBridgePlugin(dir, command, id, netns string, conf []byte) ([]byte, error) {
	cmd := exec.Command(filepath.Join(dir, "bridge"))
	cmd.Env = []string{
		"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + id, "CNI_NETNS=" + netns,
		"CNI_IFNAME=eth0", "CNI_PATH=" + dir, "PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(conf)
	return cmd.CombinedOutput()
}

// GzipLayers returns the compressed blobs of img's layers.
func GzipLayers(img v1.Image) ([][]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("read layer: %w", err)
		}
		out = append(out, data)
	}
	return out, nil
}
