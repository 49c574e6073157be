package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/fault"
	"github.com/berthcri/berth/internal/network/iptables"
	"github.com/berthcri/berth/internal/testutil/berthdtest"
	"github.com/berthcri/berth/internal/testutil/leakcheck"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A pod on the embedded default network (empty conf dir) gets an IP in the
// configured subnet that the host reaches over the bridge, its own
// hostname, pod files from its DNS config, /dev/shm and cgroup.
func TestSandboxDefaultNetworkReachableFromHost(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	st, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Status.Conditions {
		if c.Type == criapi.NetworkReady && !c.Status {
			t.Fatalf("NetworkReady false with the embedded default network: %+v", c)
		}
	}
	cfg := podConfig("web")
	cfg.Hostname = "web-host"
	cfg.DnsConfig = &criapi.DNSConfig{Servers: []string{"10.96.0.10", "8.8.8.8"}, Searches: []string{"default.svc.cluster.local", "svc.cluster.local"}, Options: []string{"ndots:5"}}
	cfg.Annotations = map[string]string{"note": "kept"}
	id := runPod(t, d, cfg)
	status, info := podStatus(t, d, id)
	if status.State != criapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("state %v", status.State)
	}
	_, subnet, _ := net.ParseCIDR(d.Config.DefaultNetwork.Subnet)
	ip := net.ParseIP(status.GetNetwork().GetIp())
	if ip == nil || !subnet.Contains(ip) {
		t.Fatalf("pod IP %q not in %s", status.GetNetwork().GetIp(), subnet)
	}
	if status.Annotations["note"] != "kept" || status.Labels["app"] != "web" || status.Metadata.Name != "web" || status.RuntimeHandler != "runc" {
		t.Fatalf("status does not round-trip the config: %+v", status)
	}
	serveInNetns(t, info.NetNSPath, 8080)
	if err := dialHello(net.JoinHostPort(ip.String(), "8080")); err != nil {
		t.Fatalf("host cannot reach pod: %v", err)
	}

	if got := readFile(t, info.HostnamePath); got != "web-host\n" {
		t.Fatalf("hostname file %q", got)
	}
	var uname unix.Utsname
	if err := inNamespace(t, info.UTSNSPath, unix.CLONE_NEWUTS, func() error { return unix.Uname(&uname) }); err != nil {
		t.Fatal(err)
	}
	if got := unix.ByteSliceToString(uname.Nodename[:]); got != "web-host" {
		t.Fatalf("hostname in pod UTS namespace %q", got)
	}
	wantResolv := "search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver 8.8.8.8\noptions ndots:5\n"
	if got := readFile(t, info.ResolvConfPath); got != wantResolv {
		t.Fatalf("resolv.conf:\n%s\nwant:\n%s", got, wantResolv)
	}
	if got := readFile(t, info.HostsPath); !strings.Contains(got, "127.0.0.1\tlocalhost") {
		t.Fatalf("hosts file %q", got)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(info.ShmPath, &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC || uint64(sfs.Blocks)*uint64(sfs.Bsize) != 64<<20 {
		t.Fatalf("pod shm %s is not a 64 MiB tmpfs: %v %+v", info.ShmPath, err, sfs)
	}
	if !strings.HasPrefix(info.CgroupParent, "/"+d.Config.CgroupParent+"/") {
		t.Fatalf("pod cgroup %q not under %q", info.CgroupParent, d.Config.CgroupParent)
	}
	if _, err := os.Stat(memoryCgroupDir(info.CgroupParent)); err != nil {
		t.Fatalf("pod cgroup missing: %v", err)
	}
	for _, p := range []string{info.NetNSPath, info.IPCNSPath, info.UTSNSPath} {
		if !strings.HasPrefix(p, filepath.Join(d.State, "netns")+"/") {
			t.Fatalf("namespace pin %q not under <state>/netns", p)
		}
	}
	if info.PIDNSPath != "" {
		t.Fatalf("pod without shared PID namespace has a holder: %q", info.PIDNSPath)
	}

	stopRemove(t, d, id)
	if err := dialHello(net.JoinHostPort(ip.String(), "8080")); err == nil {
		t.Fatalf("pod still reachable after stop")
	}
	if _, err := os.Stat(memoryCgroupDir(info.CgroupParent)); !os.IsNotExist(err) {
		t.Fatalf("pod cgroup survives remove: %v", err)
	}
}

// A hostPort mapping goes through the portmap plugin to the pod.
func TestSandboxPortMappingReachableOnHostPort(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("ports")
	hostPort := 30000 + os.Getpid()%10000
	cfg.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: 8080, HostPort: int32(hostPort)}}
	id := runPod(t, d, cfg)
	_, info := podStatus(t, d, id)
	serveInNetns(t, info.NetNSPath, 8080)
	// The bridge's gateway address is a local address of the host.
	_, subnet, _ := net.ParseCIDR(d.Config.DefaultNetwork.Subnet)
	gw := subnet.IP.To4()
	gw[3] = 1
	if err := dialHello(net.JoinHostPort(gw.String(), fmt.Sprint(hostPort))); err != nil {
		t.Fatalf("host port %d does not reach the pod: %v", hostPort, err)
	}
	stopRemove(t, d, id)
	if err := dialHello(net.JoinHostPort(gw.String(), fmt.Sprint(hostPort))); err == nil {
		t.Fatalf("host port still forwarded after stop")
	}
}

// The embedded network masquerades its pods' outgoing traffic with one
// node-level chain for its subnet (decision 1601), installed once at
// start and kept as is across restarts; a pod's ADD adds no NAT rule of
// its own, and the pod's first packet to an outside address is
// masqueraded by that chain.
func TestSandboxDefaultNetworkMasqueradesOncePerNode(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	subnet := d.Config.DefaultNetwork.Subnet
	chain := "BERTH-MASQ-" + d.Config.DefaultNetwork.Bridge
	natRules := func() []string {
		t.Helper()
		tables, err := iptables.Save(berthdtest.Ctx(t), iptables.IPv4, "nat")
		if err != nil {
			t.Fatal(err)
		}
		var rules []string
		for _, tb := range tables {
			for _, r := range tb.Rules {
				if strings.Contains(r.Line, chain) || strings.Contains(r.Line, strings.TrimSuffix(subnet, "0/24")) {
					rules = append(rules, r.Line)
				}
			}
		}
		sort.Strings(rules)
		return rules
	}
	want := []string{
		fmt.Sprintf(`-A %s ! -d 224.0.0.0/4 -m comment --comment "berth default network %s" -j MASQUERADE`, chain, d.Config.DefaultNetwork.Bridge),
		fmt.Sprintf(`-A %s -d %s -m comment --comment "berth default network %s" -j ACCEPT`, chain, subnet, d.Config.DefaultNetwork.Bridge),
		fmt.Sprintf(`-A POSTROUTING -s %s -m comment --comment "berth default network %s" -j %s`, subnet, d.Config.DefaultNetwork.Bridge, chain),
	}
	sort.Strings(want)
	if got := natRules(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("nat rules after start:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	d.Stop()
	d.Start()
	d.WaitReady()
	if got := natRules(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("nat rules after a restart:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	id := runPod(t, d, podConfig("masq"))
	_, info := podStatus(t, d, id)
	if got := natRules(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("a pod's ADD changed the nat rules:\n%s", strings.Join(got, "\n"))
	}
	masqueraded := func() int {
		t.Helper()
		out, err := exec.Command("iptables", "-t", "nat", "-L", chain, "-v", "-n", "-x").Output()
		if err != nil {
			t.Fatalf("list %s: %v", chain, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[2] == "MASQUERADE" {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
		t.Fatalf("no MASQUERADE rule in %s:\n%s", chain, out)
		return 0
	}
	before := masqueraded()
	// One UDP datagram to a documentation address (RFC 5737), routed out
	// of the node: conntrack sends its first packet through nat.
	err := inNamespace(t, info.NetNSPath, unix.CLONE_NEWNET, func() error {
		c, err := net.Dial("udp4", "198.51.100.7:9")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	})
	if err != nil {
		t.Fatalf("send from the pod: %v", err)
	}
	waitUntil(t, "the pod's packet to an outside address to be masqueraded by "+chain, func() bool { return masqueraded() != before })
	stopRemove(t, d, id)
	if got := natRules(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("nat rules after the pod's DEL:\n%s", strings.Join(got, "\n"))
	}
}

// A hostNetwork/hostIPC pod creates no namespaces and no shm, and uses the
// host's hostname and hosts file.
func TestSandboxHostNetwork(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("hostnet")
	cfg.Linux.SecurityContext = &criapi.LinuxSandboxSecurityContext{NamespaceOptions: &criapi.NamespaceOption{
		Network: criapi.NamespaceMode_NODE, Ipc: criapi.NamespaceMode_NODE, Pid: criapi.NamespaceMode_NODE,
	}}
	id := runPod(t, d, cfg)
	status, info := podStatus(t, d, id)
	if info.NetNSPath != "" || info.IPCNSPath != "" || info.UTSNSPath != "" || info.ShmPath != "" || info.PIDNSPath != "" {
		t.Fatalf("host-namespace pod got namespaces: %+v", info)
	}
	if status.GetNetwork().GetIp() != "" {
		t.Fatalf("hostNetwork pod has a CNI IP %q", status.GetNetwork().GetIp())
	}
	if got := status.GetLinux().GetNamespaces().GetOptions().GetNetwork(); got != criapi.NamespaceMode_NODE {
		t.Fatalf("status network mode %v", got)
	}
	host, _ := os.Hostname()
	if got := readFile(t, info.HostnamePath); got != host+"\n" {
		t.Fatalf("hostname %q, want host's %q", got, host)
	}
	hostHosts, _ := os.ReadFile("/etc/hosts")
	if got := readFile(t, info.HostsPath); got != string(hostHosts) {
		t.Fatalf("hosts file is not the host's")
	}
	hostResolv, _ := os.ReadFile("/etc/resolv.conf")
	if got := readFile(t, info.ResolvConfPath); got != string(hostResolv) {
		t.Fatalf("resolv.conf without DNS config is not the host's")
	}
	if entries, _ := os.ReadDir(filepath.Join(d.State, "netns")); len(entries) != 0 {
		t.Fatalf("netns pins for a host pod: %v", entries)
	}
	stopRemove(t, d, id)
}

// A pod asking for a shared PID namespace gets the berth-pause holder; it
// goes away on stop.
func TestSandboxSharedPIDNamespaceHolder(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("sharedpid")
	cfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	id := runPod(t, d, cfg)
	_, info := podStatus(t, d, id)
	if info.PIDNSPath == "" {
		t.Fatal("no PID namespace path for a shared-PID pod")
	}
	pidns, err := os.Readlink(info.PIDNSPath)
	if err != nil {
		t.Fatalf("holder's pid ns: %v", err)
	}
	self, _ := os.Readlink("/proc/self/ns/pid")
	if pidns == self {
		t.Fatal("holder runs in the host PID namespace")
	}
	// The holder shares the pod's network namespace.
	var pid int
	fmt.Sscanf(info.PIDNSPath, "/proc/%d/ns/pid", &pid)
	var holderNet, podNet unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &holderNet); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(info.NetNSPath, &podNet); err != nil {
		t.Fatal(err)
	}
	if holderNet.Ino != podNet.Ino {
		t.Fatal("holder is not in the pod's network namespace")
	}
	stopRemove(t, d, id)
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil {
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(st), ") Z") {
			t.Fatalf("holder %d survives stop", pid)
		}
	}
}

// Namespaced sysctls land in the pod's namespaces; others are refused.
func TestSandboxSysctls(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("sysctl")
	cfg.Linux.Sysctls = map[string]string{"net.ipv4.ip_unprivileged_port_start": "77", "kernel.shm_rmid_forced": "1", "fs.mqueue.msg_max": "100"}
	id := runPod(t, d, cfg)
	_, info := podStatus(t, d, id)
	var got string
	err := inNamespace(t, info.NetNSPath, unix.CLONE_NEWNET, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
		got = strings.TrimSpace(string(b))
		return err
	})
	if err != nil || got != "77" {
		t.Fatalf("pod sysctl = %q (%v), want 77", got, err)
	}
	if host, _ := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start"); strings.TrimSpace(string(host)) == "77" {
		t.Fatal("pod sysctl leaked to the host")
	}
	err = inNamespace(t, info.IPCNSPath, unix.CLONE_NEWIPC, func() error {
		b, err := os.ReadFile("/proc/sys/kernel/shm_rmid_forced")
		got = strings.TrimSpace(string(b))
		return err
	})
	if err != nil || got != "1" {
		t.Fatalf("pod IPC sysctl = %q (%v), want 1", got, err)
	}
	err = inNamespace(t, info.IPCNSPath, unix.CLONE_NEWIPC, func() error {
		b, err := os.ReadFile("/proc/sys/fs/mqueue/msg_max")
		got = strings.TrimSpace(string(b))
		return err
	})
	if err != nil || got != "100" {
		t.Fatalf("pod mqueue sysctl = %q (%v), want 100", got, err)
	}
	stopRemove(t, d, id)

	bad := podConfig("badsysctl")
	bad.Linux.Sysctls = map[string]string{"kernel.pid_max": "1000"}
	_, err = d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: bad})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
}

// A second RunPodSandbox for the same name/namespace/uid/attempt fails
// while the first exists; stop and remove are idempotent; unknown handlers
// are refused.
func TestSandboxAlreadyExistsAndIdempotentStopRemove(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ctx := berthdtest.Ctx(t)
	cfg := podConfig("dup")
	id := runPod(t, d, cfg)
	_, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
	berthdtest.WantCode(t, err, codes.AlreadyExists)
	_, err = d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: podConfig("other"), RuntimeHandler: "no-such-handler"})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	for i := 0; i < 2; i++ {
		if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatalf("stop #%d: %v", i+1, err)
		}
	}
	status, _ := podStatus(t, d, id)
	if status.State != criapi.PodSandboxState_SANDBOX_NOTREADY || status.GetNetwork().GetIp() != "" {
		t.Fatalf("stopped pod: state %v ip %q", status.State, status.GetNetwork().GetIp())
	}
	// Still reserved while it exists, stopped or not.
	_, err = d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
	berthdtest.WantCode(t, err, codes.AlreadyExists)
	for i := 0; i < 2; i++ {
		if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatalf("remove #%d: %v", i+1, err)
		}
	}
	_, err = d.Runtime.PodSandboxStatus(ctx, &criapi.PodSandboxStatusRequest{PodSandboxId: id})
	berthdtest.WantCode(t, err, codes.NotFound)
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: "does-not-exist"}); err != nil {
		t.Fatalf("stop of unknown sandbox: %v", err)
	}
	// The name is free again.
	id2 := runPod(t, d, cfg)
	// Remove without stop forces the stop.
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id2}); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.State, "netns")); len(entries) != 0 {
		t.Fatalf("pins left after remove: %v", entries)
	}
}

func TestSandboxListFilters(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ctx := berthdtest.Ctx(t)
	a := podConfig("a")
	a.Labels = map[string]string{"tier": "front", "app": "a"}
	b := podConfig("b")
	b.Labels = map[string]string{"tier": "back", "app": "b"}
	c := podConfig("c")
	c.Labels = map[string]string{"tier": "front", "app": "c"}
	idA, idB, idC := runPod(t, d, a), runPod(t, d, b), runPod(t, d, c)
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: idC}); err != nil {
		t.Fatal(err)
	}
	list := func(f *criapi.PodSandboxFilter) []string {
		t.Helper()
		resp, err := d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, it := range resp.Items {
			ids = append(ids, it.Id)
		}
		return ids
	}
	eq := func(what string, got []string, want ...string) {
		t.Helper()
		gs, ws := map[string]bool{}, map[string]bool{}
		for _, g := range got {
			gs[g] = true
		}
		for _, w := range want {
			ws[w] = true
		}
		if len(got) != len(want) || len(gs) != len(ws) {
			t.Fatalf("%s: got %v, want %v", what, got, want)
		}
		for w := range ws {
			if !gs[w] {
				t.Fatalf("%s: got %v, want %v", what, got, want)
			}
		}
	}
	eq("all", list(nil), idA, idB, idC)
	eq("id", list(&criapi.PodSandboxFilter{Id: idB}), idB)
	eq("id prefix", list(&criapi.PodSandboxFilter{Id: idA[:12]}), idA)
	eq("ready", list(&criapi.PodSandboxFilter{State: &criapi.PodSandboxStateValue{State: criapi.PodSandboxState_SANDBOX_READY}}), idA, idB)
	eq("notready", list(&criapi.PodSandboxFilter{State: &criapi.PodSandboxStateValue{State: criapi.PodSandboxState_SANDBOX_NOTREADY}}), idC)
	eq("label", list(&criapi.PodSandboxFilter{LabelSelector: map[string]string{"tier": "front"}}), idA, idC)
	eq("labels", list(&criapi.PodSandboxFilter{LabelSelector: map[string]string{"tier": "front", "app": "a"}}), idA)
	eq("label+state", list(&criapi.PodSandboxFilter{LabelSelector: map[string]string{"tier": "front"}, State: &criapi.PodSandboxStateValue{State: criapi.PodSandboxState_SANDBOX_READY}}), idA)
	resp, _ := d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{Filter: &criapi.PodSandboxFilter{Id: idB}})
	if it := resp.Items[0]; it.Labels["tier"] != "back" || it.Metadata.Uid != "b-uid" || it.RuntimeHandler != "runc" || it.CreatedAt == 0 {
		t.Fatalf("list item does not round-trip: %+v", it)
	}
	for _, id := range []string{idA, idB, idC} {
		stopRemove(t, d, id)
	}
	eq("after remove", list(nil))
}

// A config in the conf dir replaces the embedded network, and removing it
// brings the embedded one back (the directory is re-read when it changes).
func TestSandboxConfDirConfigIsUsedAndReloaded(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	subnet := d.Config.DefaultNetwork.Subnet
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"fromdir","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":true,
"ipam":{"type":"host-local","ranges":[[{"subnet":%q,"rangeStart":"%s200"}]],"dataDir":%q}}]}`,
		d.Config.DefaultNetwork.Bridge, subnet, strings.TrimSuffix(subnet, "0/24"), filepath.Join(d.Root, "cni", "networks"))
	if err := os.MkdirAll(d.Config.CNIConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	confPath := filepath.Join(d.Config.CNIConfDir, "10-fromdir.conflist")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	id := runPod(t, d, podConfig("fromdir"))
	st, _ := podStatus(t, d, id)
	if ip := st.GetNetwork().GetIp(); !strings.HasSuffix(ip, ".200") {
		t.Fatalf("pod IP %q not from the conf dir's range (.200+)", ip)
	}
	if err := os.Remove(confPath); err != nil {
		t.Fatal(err)
	}
	id2 := runPod(t, d, podConfig("embedded"))
	st2, _ := podStatus(t, d, id2)
	if ip := st2.GetNetwork().GetIp(); ip == "" || strings.HasSuffix(ip, ".200") || strings.HasSuffix(ip, ".201") {
		t.Fatalf("pod IP %q: embedded network not back", ip)
	}
	// The first pod still detaches with the config it was attached with.
	stopRemove(t, d, id)
	stopRemove(t, d, id2)
	if files, _ := os.ReadDir(filepath.Join(d.Root, "cni", "networks", "fromdir")); len(files) > 2 {
		t.Fatalf("IPAM reservation of the conf-dir network leaked: %v", files)
	}

	// A config naming a plugin that is not installed makes NetworkReady
	// false with a reason, and RunPodSandbox fail cleanly.
	broken := `{"cniVersion":"1.0.0","name":"broken","plugins":[{"type":"no-such-plugin"}]}`
	if err := os.WriteFile(filepath.Join(d.Config.CNIConfDir, "00-broken.conflist"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	status, err := d.Runtime.Status(berthdtest.Ctx(t), &criapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range status.Status.Conditions {
		if c.Type == criapi.NetworkReady && (c.Status || !strings.Contains(c.Message, "no-such-plugin")) {
			t.Fatalf("NetworkReady with a missing plugin: %+v", c)
		}
	}
	if _, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig("broken")}); err == nil {
		t.Fatal("RunPodSandbox succeeded with a broken network config")
	}
}

// After a crash, sandboxes come back from their checkpoints; one whose
// network namespace pin was deleted lists NOTREADY and still stops (CNI
// DEL from the checkpointed config) and removes.
func TestSandboxCheckpointRestoreAndNotReadyAfterCrash(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ok := podConfig("survivor")
	// Its PID namespace holder must be found again after the restart.
	ok.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
	lost := podConfig("lost")
	lost.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(20000 + os.Getpid()%10000)}}
	idOK, idLost := runPod(t, d, ok), runPod(t, d, lost)
	stOK, infoOK := podStatus(t, d, idOK)
	_, infoLost := podStatus(t, d, idLost)
	var holder int
	fmt.Sscanf(infoOK.PIDNSPath, "/proc/%d/ns/pid", &holder)
	if holder == 0 {
		t.Fatalf("no PID namespace holder: %+v", infoOK)
	}
	scope := leakcheck.ForDaemon(d)

	d.Kill()
	if err := unix.Unmount(infoLost.NetNSPath, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(infoLost.NetNSPath); err != nil {
		t.Fatal(err)
	}
	d.Start()
	d.WaitReady()

	resp, err := d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]criapi.PodSandboxState{}
	for _, it := range resp.Items {
		states[it.Id] = it.State
	}
	if states[idOK] != criapi.PodSandboxState_SANDBOX_READY || states[idLost] != criapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Fatalf("after restart: %v (want %s READY, %s NOTREADY)", states, idOK, idLost)
	}
	stOK2, _ := podStatus(t, d, idOK)
	if stOK2.GetNetwork().GetIp() != stOK.GetNetwork().GetIp() || stOK2.Labels["app"] != "survivor" {
		t.Fatalf("restored status differs: %+v vs %+v", stOK2, stOK)
	}
	lostIP := func() string { st, _ := podStatus(t, d, idLost); return st.GetNetwork().GetIp() }()
	stopRemove(t, d, idLost)
	stopRemove(t, d, idOK)
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", holder)); err == nil && !strings.Contains(string(st), ") Z") {
		t.Fatalf("holder %d of the restored pod survives its removal: %s", holder, st)
	}
	// CNI DEL released the lost pod's address and port-forwarding rules.
	after := leakcheck.Take(t, scope)
	for _, f := range after["ipam"] {
		if filepath.Base(f) == lostIP {
			t.Fatalf("IP %s of the pod whose netns vanished is still reserved", lostIP)
		}
	}
	for _, r := range after["iptables"] {
		if strings.Contains(r, lostIP+"/") || strings.Contains(r, lostIP+":") || strings.Contains(r, idLost) {
			t.Fatalf("iptables rule of the lost pod survives: %s", r)
		}
	}
	resp, _ = d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
	if len(resp.Items) != 0 {
		t.Fatalf("sandboxes left: %v", resp.Items)
	}
}

// 50 run/stop/remove cycles, some failing mid-way on purpose (broken CNI
// configs, a non-namespaced sysctl), leave nothing behind.
func TestSandboxLifecycleLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ctx := berthdtest.Ctx(t)
	scope := leakcheck.ForDaemon(d)
	if err := os.MkdirAll(d.Config.CNIConfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Warm up: the bridge and host-local's lock file exist from the first pod on.
	warm := runPod(t, d, podConfig("warm"))
	stopRemove(t, d, warm)
	before := leakcheck.Take(t, scope)

	brokenPath := filepath.Join(d.Config.CNIConfDir, "00-broken.conflist")
	// The bridge plugin succeeds, then a plugin that is not installed fails:
	// the veth and IP the bridge made must be undone.
	failLate := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"berth","plugins":[{"type":"bridge","bridge":%q,"isGateway":true,"ipMasq":true,
"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}},{"type":"no-such-plugin"}]}`,
		d.Config.DefaultNetwork.Bridge, d.Config.DefaultNetwork.Subnet, scope.IPAMDir)
	notJSON := `{"cniVersion": "1.0.0", "name": "half`
	failures := 0
	for i := 0; i < 50; i++ {
		cfg := podConfig(fmt.Sprintf("cycle-%d", i))
		cfg.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(40000 + i)}}
		if i%5 == 4 {
			cfg.Linux.SecurityContext.NamespaceOptions.Pid = criapi.NamespaceMode_POD
		}
		broken := ""
		switch i % 10 {
		case 3:
			broken = failLate
		case 7:
			broken = notJSON
		}
		if broken != "" {
			if err := os.WriteFile(brokenPath, []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := d.Runtime.RunPodSandbox(ctx, &criapi.RunPodSandboxRequest{Config: cfg})
		if broken != "" {
			if err == nil {
				t.Fatalf("cycle %d: RunPodSandbox succeeded with a broken CNI config", i)
			}
			failures++
			if err := os.Remove(brokenPath); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		stopRemove(t, d, resp.PodSandboxId)
	}
	if failures != 10 {
		t.Fatalf("%d failing cycles, want 10", failures)
	}
	leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	resp, _ := d.Runtime.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if len(resp.Items) != 0 {
		t.Fatalf("%d sandboxes listed after the cycles", len(resp.Items))
	}
}

// The pod's cgroup goes below the config's cgroup_parent; cpuset is usable.
func TestSandboxCgroupUnderConfigParent(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	cfg := podConfig("cg")
	parent := "/" + d.Config.CgroupParent + "/kubepods/burstable/pod-cg-uid"
	cfg.Linux.CgroupParent = parent
	cfg.Linux.Overhead = &criapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 20}
	id := runPod(t, d, cfg)
	_, info := podStatus(t, d, id)
	if info.CgroupParent != parent+"/pod-"+id {
		t.Fatalf("pod cgroup %q, want %q", info.CgroupParent, parent+"/pod-"+id)
	}
	memDir := filepath.Join("/sys/fs/cgroup/memory", info.CgroupParent)
	if cgroupV2() {
		// v2: the controllers are enabled down to the pod cgroup before
		// any container exists.
		memDir = filepath.Join("/sys/fs/cgroup", info.CgroupParent)
		for _, f := range []string{"memory.max", "pids.max", "cpu.max"} {
			if _, err := os.Stat(filepath.Join(memDir, f)); err != nil {
				t.Fatalf("pod cgroup without %s: %v", f, err)
			}
		}
		if cpus := readFile(t, filepath.Join(memDir, "cpuset.cpus.effective")); strings.TrimSpace(cpus) == "" {
			t.Fatal("pod cpuset has no cpus")
		}
	} else {
		for _, h := range []string{"memory", "pids", "cpu"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h, info.CgroupParent)); err != nil {
				t.Fatalf("pod cgroup in %s: %v", h, err)
			}
		}
		if cpus := readFile(t, filepath.Join("/sys/fs/cgroup/cpuset", info.CgroupParent, "cpuset.cpus")); strings.TrimSpace(cpus) == "" {
			t.Fatal("pod cpuset has no cpus")
		}
	}
	stopRemove(t, d, id)
	if _, err := os.Stat(memDir); !os.IsNotExist(err) {
		t.Fatalf("pod cgroup survives remove: %v", err)
	}
}

// Pods started concurrently each get their own namespaces and address.
func TestSandboxConcurrentRuns(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	const n = 8
	ids := make([]string, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig(fmt.Sprintf("conc-%d", i))})
			if err == nil {
				ids[i] = resp.PodSandboxId
			}
			errs <- err
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent RunPodSandbox: %v", err)
		}
	}
	ips := map[string]bool{}
	for _, id := range ids {
		st, _ := podStatus(t, d, id)
		if st.GetNetwork().GetIp() == "" || ips[st.GetNetwork().GetIp()] {
			t.Fatalf("pod %s: IP %q missing or duplicated", id, st.GetNetwork().GetIp())
		}
		ips[st.GetNetwork().GetIp()] = true
	}
	for _, id := range ids {
		go func(id string) {
			_, err := d.Runtime.RemovePodSandbox(berthdtest.Ctx(t), &criapi.RemovePodSandboxRequest{PodSandboxId: id})
			errs <- err
		}(id)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent RemovePodSandbox: %v", err)
		}
	}
	resp, _ := d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
	if len(resp.Items) != 0 {
		t.Fatalf("%d sandboxes left", len(resp.Items))
	}

	// The same pod requested n times at once: exactly one wins.
	won := make(chan string, n)
	for i := 0; i < n; i++ {
		go func() {
			resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig("same")})
			if err == nil {
				won <- resp.PodSandboxId
			} else if status.Code(err) != codes.AlreadyExists {
				won <- "error: " + err.Error()
			} else {
				won <- ""
			}
		}()
	}
	var winners []string
	for i := 0; i < n; i++ {
		if id := <-won; id != "" {
			winners = append(winners, id)
		}
	}
	if len(winners) != 1 || strings.HasPrefix(winners[0], "error: ") {
		t.Fatalf("concurrent runs of one pod: winners %v, want exactly one", winners)
	}
	stopRemove(t, d, winners[0])
}

// berthd dying in the middle of RunPodSandbox (before and after CNI ADD)
// leaves a NOTREADY sandbox after restart whose stop and remove release
// everything, IP and iptables rules included.
func TestSandboxCrashMidRunRecovers(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	scope := leakcheck.ForDaemon(d)
	warm := runPod(t, d, podConfig("warm"))
	stopRemove(t, d, warm)
	before := leakcheck.Take(t, scope)
	for _, point := range []fault.Point{fault.SandboxAfterNetnsCreate, fault.SandboxAfterCNIAdd} {
		d.Kill()
		d.SetEnv(fault.EnvVar + "=" + string(point))
		d.Start()
		d.WaitReady()
		cfg := podConfig("crash-" + string(point))
		cfg.PortMappings = []*criapi.PortMapping{{Protocol: criapi.Protocol_TCP, ContainerPort: 80, HostPort: int32(25000 + os.Getpid()%10000)}}
		if _, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: cfg}); err == nil {
			t.Fatalf("%s: RunPodSandbox succeeded though berthd was to crash", point)
		}
		select {
		case <-d.Exited():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: berthd did not exit", point)
		}
		d.SetEnv()
		d.Start()
		d.WaitReady()
		resp, err := d.Runtime.ListPodSandbox(berthdtest.Ctx(t), &criapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Items) != 1 || resp.Items[0].State != criapi.PodSandboxState_SANDBOX_NOTREADY || resp.Items[0].Metadata.Name != cfg.Metadata.Name {
			t.Fatalf("%s: after restart want one NOTREADY sandbox, got %v", point, resp.Items)
		}
		// The name stays reserved until the half-made sandbox is removed.
		_, err = d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: podConfig(cfg.Metadata.Name)})
		berthdtest.WantCode(t, err, codes.AlreadyExists)
		stopRemove(t, d, resp.Items[0].Id)
		leakcheck.CheckSettled(t, scope, before, leakcheck.Take(t, scope))
	}
}
