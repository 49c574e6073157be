package nri

import (
	"fmt"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// specEdit is the small OCI-spec editor NRI's spec generator drives
// (github.com/containerd/nri/pkg/runtime-tools/generate.UnderlyingGenerator):
// every method edits the spec in place, creating the sections it needs.
type specEdit struct{ spec *specs.Spec }

func (g *specEdit) Spec() *specs.Spec { return g.spec }

func (g *specEdit) process() *specs.Process {
	if g.spec.Process == nil {
		g.spec.Process = &specs.Process{}
	}
	return g.spec.Process
}

func (g *specEdit) linux() *specs.Linux {
	if g.spec.Linux == nil {
		g.spec.Linux = &specs.Linux{}
	}
	return g.spec.Linux
}

func (g *specEdit) resources() *specs.LinuxResources {
	l := g.linux()
	if l.Resources == nil {
		l.Resources = &specs.LinuxResources{}
	}
	return l.Resources
}

func (g *specEdit) cpu() *specs.LinuxCPU {
	r := g.resources()
	if r.CPU == nil {
		r.CPU = &specs.LinuxCPU{}
	}
	return r.CPU
}

func (g *specEdit) memory() *specs.LinuxMemory {
	r := g.resources()
	if r.Memory == nil {
		r.Memory = &specs.LinuxMemory{}
	}
	return r.Memory
}

func (g *specEdit) hooks() *specs.Hooks {
	if g.spec.Hooks == nil {
		g.spec.Hooks = &specs.Hooks{}
	}
	return g.spec.Hooks
}

func (g *specEdit) AddAnnotation(key, value string) {
	if g.spec.Annotations == nil {
		g.spec.Annotations = map[string]string{}
	}
	g.spec.Annotations[key] = value
}

func (g *specEdit) RemoveAnnotation(key string) { delete(g.spec.Annotations, key) }

func (g *specEdit) AddDevice(d specs.LinuxDevice) {
	l := g.linux()
	for i, have := range l.Devices {
		if have.Path == d.Path {
			l.Devices[i] = d
			return
		}
	}
	l.Devices = append(l.Devices, d)
}

func (g *specEdit) RemoveDevice(path string) {
	l := g.linux()
	for i, d := range l.Devices {
		if d.Path == path {
			l.Devices = append(l.Devices[:i], l.Devices[i+1:]...)
			return
		}
	}
}

func (g *specEdit) AddLinuxResourcesDevice(allow bool, devType string, major, minor *int64, access string) {
	r := g.resources()
	r.Devices = append(r.Devices, specs.LinuxDeviceCgroup{Allow: allow, Type: devType, Major: major, Minor: minor, Access: access})
}

func (g *specEdit) AddOrReplaceLinuxNamespace(ns, path string) error {
	l := g.linux()
	t := specs.LinuxNamespaceType(ns)
	for i, have := range l.Namespaces {
		if have.Type == t {
			l.Namespaces[i].Path = path
			return nil
		}
	}
	l.Namespaces = append(l.Namespaces, specs.LinuxNamespace{Type: t, Path: path})
	return nil
}

func (g *specEdit) RemoveLinuxNamespace(ns string) error {
	l := g.linux()
	for i, have := range l.Namespaces {
		if have.Type == specs.LinuxNamespaceType(ns) {
			l.Namespaces = append(l.Namespaces[:i], l.Namespaces[i+1:]...)
			return nil
		}
	}
	return nil
}

func (g *specEdit) AddPreStartHook(h specs.Hook) {
	hk := g.hooks()
	//lint:ignore SA1019 NRI plugins still inject prestart hooks; runc runs them
	hk.Prestart = append(hk.Prestart, h)
}

func (g *specEdit) AddPostStartHook(h specs.Hook) {
	g.hooks().Poststart = append(g.hooks().Poststart, h)
}
func (g *specEdit) AddPostStopHook(h specs.Hook) { g.hooks().Poststop = append(g.hooks().Poststop, h) }

func (g *specEdit) AddProcessEnv(name, value string) {
	p := g.process()
	kv := name + "=" + value
	for i, e := range p.Env {
		if strings.SplitN(e, "=", 2)[0] == name {
			p.Env[i] = kv
			return
		}
	}
	p.Env = append(p.Env, kv)
}

func (g *specEdit) ClearProcessEnv() { g.process().Env = nil }

func (g *specEdit) SetProcessArgs(args []string) { g.process().Args = args }

func (g *specEdit) SetProcessOOMScoreAdj(adj int) { g.process().OOMScoreAdj = &adj }

func (g *specEdit) AddLinuxResourcesHugepageLimit(pageSize string, limit uint64) {
	r := g.resources()
	for i, h := range r.HugepageLimits {
		if h.Pagesize == pageSize {
			r.HugepageLimits[i].Limit = limit
			return
		}
	}
	r.HugepageLimits = append(r.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: pageSize, Limit: limit})
}

func (g *specEdit) AddLinuxResourcesUnified(key, val string) {
	r := g.resources()
	if r.Unified == nil {
		r.Unified = map[string]string{}
	}
	r.Unified[key] = val
}

func (g *specEdit) AddMount(m specs.Mount) { g.spec.Mounts = append(g.spec.Mounts, m) }
func (g *specEdit) ClearMounts()           { g.spec.Mounts = nil }
func (g *specEdit) Mounts() []specs.Mount  { return g.spec.Mounts }

func (g *specEdit) RemoveMount(dest string) {
	for i, m := range g.spec.Mounts {
		if m.Destination == dest {
			g.spec.Mounts = append(g.spec.Mounts[:i], g.spec.Mounts[i+1:]...)
			return
		}
	}
}

func (g *specEdit) AddLinuxSysctl(key, value string) {
	l := g.linux()
	if l.Sysctl == nil {
		l.Sysctl = map[string]string{}
	}
	l.Sysctl[key] = value
}

func (g *specEdit) RemoveLinuxSysctl(key string) { delete(g.linux().Sysctl, key) }

func (g *specEdit) SetLinuxCgroupsPath(path string) { g.linux().CgroupsPath = path }

func (g *specEdit) SetLinuxResourcesCPUCpus(cpus string)        { g.cpu().Cpus = cpus }
func (g *specEdit) SetLinuxResourcesCPUMems(mems string)        { g.cpu().Mems = mems }
func (g *specEdit) SetLinuxResourcesCPUPeriod(p uint64)         { g.cpu().Period = &p }
func (g *specEdit) SetLinuxResourcesCPUQuota(q int64)           { g.cpu().Quota = &q }
func (g *specEdit) SetLinuxResourcesCPURealtimePeriod(p uint64) { g.cpu().RealtimePeriod = &p }
func (g *specEdit) SetLinuxResourcesCPURealtimeRuntime(t int64) { g.cpu().RealtimeRuntime = &t }
func (g *specEdit) SetLinuxResourcesCPUShares(s uint64)         { g.cpu().Shares = &s }
func (g *specEdit) SetLinuxResourcesMemoryLimit(l int64)        { g.memory().Limit = &l }
func (g *specEdit) SetLinuxResourcesMemorySwap(s int64)         { g.memory().Swap = &s }

func (g *specEdit) SetLinuxRootPropagation(rp string) error {
	switch rp {
	case "", "private", "rprivate", "slave", "rslave", "shared", "rshared", "unbindable", "runbindable":
		g.linux().RootfsPropagation = rp
		return nil
	}
	return fmt.Errorf("rootfs propagation %q is not valid", rp)
}
