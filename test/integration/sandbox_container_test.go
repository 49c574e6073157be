package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
	"github.com/berthcri/berth/internal/testutil/testimages"
)

// The pod's hostname, DNS config, sysctls, /dev/shm and network
// namespace are what its containers see.
func TestSandboxSettingsVisibleInContainer(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := podConfig("visible")
	cfg.Hostname = "visible-host"
	cfg.DnsConfig = &criapi.DNSConfig{Servers: []string{"10.96.0.10"}, Searches: []string{"ns.svc.cluster.local"}, Options: []string{"ndots:5"}}
	cfg.Linux.Sysctls = map[string]string{"kernel.shm_rmid_forced": "1", "net.ipv4.ip_unprivileged_port_start": "77"}
	pe := e.podEnv(cfg)
	status, info := podStatus(t, pe.d, pe.pod)

	lines, st := pe.output(pe.config("show", "sh", "-c", strings.Join([]string{
		"hostname", "cat /etc/hostname", "cat /etc/resolv.conf",
		"cat /proc/sys/kernel/shm_rmid_forced", "cat /proc/sys/net/ipv4/ip_unprivileged_port_start",
		"grep ' /dev/shm ' /proc/mounts | cut -d' ' -f3", "ip -o -4 addr show eth0 | awk '{print $4}'",
	}, "; ")))
	if st.ExitCode != 0 {
		t.Fatalf("container exit %d: %v", st.ExitCode, lines)
	}
	want := []string{
		"visible-host", "visible-host",
		"search ns.svc.cluster.local", "nameserver 10.96.0.10", "options ndots:5",
		"1", "77", "tmpfs",
	}
	if len(lines) != len(want)+1 {
		t.Fatalf("container saw:\n%s", strings.Join(lines, "\n"))
	}
	for i, w := range want {
		if lines[i] != w {
			t.Fatalf("line %d: got %q, want %q; all:\n%s", i, lines[i], w, strings.Join(lines, "\n"))
		}
	}
	if ip, _, _ := strings.Cut(lines[len(want)], "/"); ip != status.GetNetwork().GetIp() {
		t.Fatalf("container eth0 %q, pod IP %q", lines[len(want)], status.GetNetwork().GetIp())
	}

	// A long-running container shares the pinned namespaces.
	id := pe.run(pe.config("sleeper", "sleep", "300"))
	pid := containerPid(t, pe.d, id)
	for kind, pin := range map[string]string{"net": info.NetNSPath, "ipc": info.IPCNSPath, "uts": info.UTSNSPath} {
		ctr, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
		var pinSt, ctrSt os.FileInfo
		pinSt, err2 := os.Stat(pin)
		ctrSt, err3 := os.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
		if err1 != nil || err2 != nil || err3 != nil || !os.SameFile(pinSt, ctrSt) {
			t.Fatalf("container %s namespace %s is not the pod's pin %s (%v %v %v)", kind, ctr, pin, err1, err2, err3)
		}
	}
	if cg := cgroupOf(t, pid, "memory"); !strings.HasPrefix(cg, info.CgroupParent+"/") {
		t.Fatalf("container cgroup %q not below the pod's %q", cg, info.CgroupParent)
	}
	stopRemove(t, pe.d, pe.pod)
}

// In a pod with a shared PID namespace, pid 1 is berth-pause and the
// containers see each other.
func TestSandboxSharedPIDVisibleInContainer(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	cfg := podConfig("sharedpid-ctr")
	cfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	pe := e.podEnv(cfg)
	sleeper := pe.config("sleeper", "sleep", "300")
	sleeper.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	pe.run(sleeper)
	show := pe.config("show", "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; echo; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -q '^sleep 300' && echo sees-sleeper")
	show.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	lines, st := pe.output(show)
	if st.ExitCode != 0 || len(lines) != 2 || !strings.Contains(lines[0], "berth-pause") || lines[1] != "sees-sleeper" {
		t.Fatalf("shared PID namespace as seen by a container (exit %d):\n%s", st.ExitCode, strings.Join(lines, "\n"))
	}
	stopRemove(t, pe.d, pe.pod)
}

// A web server container is reachable from the host on the pod IP and on
// the mapped host port.
func TestSandboxPortMappingToContainer(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t, testimages.HTTPDRef)
	cfg := podConfig("web-ctr")
	hostPort := 31000 + os.Getpid()%10000
	cfg.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: testimages.HTTPDPort, HostPort: int32(hostPort)}}
	pe := e.podEnv(cfg)
	status, _ := podStatus(t, pe.d, pe.pod)
	web := pe.config("web")
	web.Image = &criapi.ImageSpec{Image: pe.reg.Ref(testimages.HTTPDRef)}
	pe.run(web)

	_, subnet, _ := net.ParseCIDR(pe.d.Config.DefaultNetwork.Subnet)
	gw := subnet.IP.To4()
	gw[3] = 1
	for _, addr := range []string{
		net.JoinHostPort(status.GetNetwork().GetIp(), fmt.Sprint(testimages.HTTPDPort)),
		net.JoinHostPort(gw.String(), fmt.Sprint(hostPort)),
	} {
		var body string
		waitUntil(t, "an HTTP 200 from "+addr, func() bool {
			c := http.Client{Timeout: 2 * time.Second}
			resp, err := c.Get("http://" + addr + "/")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return resp.StatusCode == http.StatusOK
		})
		if body != testimages.HTTPDIndex {
			t.Fatalf("GET %s: %q", addr, body)
		}
	}
	stopRemove(t, pe.d, pe.pod)
}

// RemovePodSandbox on a pod with running containers (no stop first) takes
// the containers, their shim and the pod down and leaves nothing behind.
func TestSandboxRemoveWithRunningContainersLeavesNothing(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	scope := leakcheck.ForDaemon(e.d)
	before := leakcheck.Take(t, scope)
	for _, pid := range []criapi.NamespaceMode{criapi.NamespaceMode_CONTAINER, criapi.NamespaceMode_POD} {
		cfg := podConfig(fmt.Sprintf("busy-%d", pid))
		cfg.Linux.SecurityContext.NamespaceOptions.Pid = pid
		cfg.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(32000 + int(pid) + os.Getpid()%10000)}}
		pe := e.podEnv(cfg)
		for _, name := range []string{"a", "b"} {
			c := pe.config(name, "sleep", "300")
			c.Linux.SecurityContext.NamespaceOptions.Pid = pid
			pe.run(c)
		}
		if _, err := pe.d.Runtime.RemovePodSandbox(berthdtest.Ctx(t), &criapi.RemovePodSandboxRequest{PodSandboxId: pe.pod}); err != nil {
			t.Fatalf("RemovePodSandbox with running containers: %v", err)
		}
		resp, err := pe.d.Runtime.ListContainers(berthdtest.Ctx(t), &criapi.ListContainersRequest{Filter: &criapi.ContainerFilter{PodSandboxId: pe.pod}})
		if err != nil || len(resp.Containers) != 0 {
			t.Fatalf("containers of the removed pod: %v %v", resp.GetContainers(), err)
		}
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
}
