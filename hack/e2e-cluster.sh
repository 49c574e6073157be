#!/usr/bin/env bash
# make e2e-cluster: a two-node Kubernetes cluster of berth nodes on this
# machine, offline, and the upstream cluster suite (e2e.test) against it
# (issue #25; docs/e2e-cluster.md, decision 3200). Every program comes from
# the Go module proxy at the versions test/k8s pins (hack/k8s-bins.sh
# cluster); images from test/e2enode/registry, a loopback registry of
# stand-ins.
#
# The layout (all addresses private to the run's network namespaces: the
# host's network is not touched):
#
#   netns berthc-cp   the control plane: etcd (127.0.0.1:2379), kube-apiserver
#                     (172.31.0.1:6443), kube-controller-manager,
#                     kube-scheduler, the image registry (172.31.0.1:5000),
#                     and the suite; bridge berthc0 172.31.0.1/24, no uplink;
#                     routes to each node's pod CIDR via the node
#   netns berthc-n<i> node berth-worker-<i>, eth0 172.31.0.1<i>/24 (a veth on
#                     berthc0), pods on cni0 in 10.244.<i>.0/24 (CNI bridge +
#                     host-local + portmap), routes to the other node's pods;
#                     its own mount, UTS and cgroup namespaces (sysfs and the
#                     cgroup hierarchies mounted afresh; /var/lib/kubelet,
#                     /var/log and /etc/machine-id the node's own), its own
#                     berthd, kubelet and kube-proxy (iptables mode)
#
# Services 10.96.0.0/16 (kubernetes 10.96.0.1, cluster DNS 10.96.0.10:
# CoreDNS as a Deployment, no forward). Certificates are made with openssl.
#
#   hack/e2e-cluster.sh [conformance]  up, smoke, both suite passes, down (make e2e-cluster)
#   hack/e2e-cluster.sh smoke          up, smoke checks, down
#   hack/e2e-cluster.sh up             up and smoke, then wait until interrupted
#                                      (kubectl: the command it prints)
#   E2E_CLUSTER_FOCUS='\[Conformance\].*ConfigMap' ...   narrow the suite
#   E2E_CLUSTER_PASSES=parallel|serial|both (default both)
#   E2E_CLUSTER_PROCS=8     parallel pass processes (most specs wait on the cluster:
#                           8 halved the pass against 4 on 2 cores, nothing flaked)
#   E2E_CLUSTER_ARGS=...    extra suite flags
#   E2E_CLUSTER_TIMEOUT=6h  ginkgo's timeout of each pass (it still writes its reports)
#
# Results, logs and the summary go to ${E2E_CLUSTER_OUT:-out/e2e-cluster/<UTC time>}.
# Everything the run made (processes, namespaces, veths, the bridge,
# iptables rules, mounts, cgroups) goes on exit, failure or interrupt; the
# teardown checks and says what, if anything, is left (teardown.txt).
set -euo pipefail

repo=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$repo"
. hack/lib/cgroups.sh
. hack/lib/suite.sh

CP_NS=berthc-cp
BRIDGE=berthc0
CP_IP=172.31.0.1
NODE_NET=172.31.0
POD_NET=10.244
SVC_CIDR=10.96.0.0/16
SVC_API=10.96.0.1
DNS_IP=10.96.0.10
NODES=(1 2)
REG_PORT=5000
COREDNS_IMAGE=registry.k8s.io/coredns/coredns:v1.15.0

node_name() { echo "berth-worker-$1"; }
node_ns() { echo "berthc-n$1"; }
node_ip() { echo "$NODE_NET.1$1"; }

# cgroup hierarchies: "mountpoint fstype superopts" of each cgroup mount.

log() { echo "e2e-cluster: $*" >&2; }

# ---------------------------------------------------------------------------
# The node, inside its namespaces (net joined, mount/UTS/cgroup new): mounts,
# then berthd, the kubelet and kube-proxy; waits for them. Started by the
# outer part as `hack/e2e-cluster.sh node-inner <i>`.
if [ "${1:-}" = node-inner ]; then
	i=$2
	nd=$BERTH_CLUSTER_WORK/n$i
	bins=$BERTH_CLUSTER_BINS
	nout=$BERTH_CLUSTER_OUT/n$i
	hostname "$(node_name "$i")"
	# sysfs of this network namespace (/sys/class/net shows the node's
	# interfaces), and the cgroup hierarchies mounted afresh so that their
	# root is the node's cgroup (the cgroup namespace's root): the
	# kubelet's "/" is the node.
	mapfile -t cgs < <(cgroup_mounts)
	links=()
	for e in /sys/fs/cgroup/*; do
		[ -L "$e" ] && links+=("${e##*/}=$(readlink "$e")")
	done
	umount -R /sys || umount -R -l /sys
	mount -t sysfs sysfs /sys
	mount -t tmpfs -o mode=755,size=4m cgroup /sys/fs/cgroup
	for l in "${cgs[@]}"; do
		read -r mnt fstype opts <<<"$l"
		mkdir -p "$mnt"
		if [ "$fstype" = cgroup2 ]; then
			mount -t cgroup2 cgroup2 "$mnt"
		else
			mount -t cgroup -o "${opts#rw,}" cgroup "$mnt"
		fi
	done
	for l in "${links[@]}"; do ln -s "${l#*=}" "/sys/fs/cgroup/${l%%=*}"; done
	mount -o remount,ro /sys/fs/cgroup
	# The node's own kubelet root (shared: volume mounts reach berthd and
	# runc, which run in this namespace), logs and machine ID.
	mount --bind "$nd/kubelet" /var/lib/kubelet
	mount --make-private /var/lib/kubelet
	mount --make-rshared /var/lib/kubelet
	mount --bind "$nd/log" /var/log
	mount --bind "$nd/machine-id" /etc/machine-id
	ip link set lo up
	sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 \
		net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0

	# berthd in /berthd of the node (the kubelet's runtime cgroup).
	procs=()
	for h in /sys/fs/cgroup/*/; do
		[ -f "${h}cgroup.procs" ] || continue
		mkdir -p "${h}berthd"
		if [ -f "${h}cpuset.cpus" ]; then
			cat "${h}cpuset.cpus" >"${h}berthd/cpuset.cpus"
			cat "${h}cpuset.mems" >"${h}berthd/cpuset.mems"
		fi
		procs+=("${h}berthd/cgroup.procs")
	done
	bash -c 'n=$1; shift; for f in "${@:1:n}"; do echo $$ >"$f"; done; shift "$n"; exec "$@"' \
		sh ${#procs[@]} "${procs[@]}" "$repo/bin/berthd" --config "$nd/berth.toml" >"$nout/berthd.log" 2>&1 &
	for _ in $(seq 1 300); do
		"$repo/bin/berthctl" --address "unix://$nd/berth.sock" info >/dev/null 2>&1 && break
		sleep 0.1
	done
	"$bins/kubelet" --config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.conf" \
		--container-runtime-endpoint="unix://$nd/berth.sock" --node-ip="$(node_ip "$i")" \
		--hostname-override="$(node_name "$i")" --runtime-cgroups=/berthd --v=2 >"$nout/kubelet.log" 2>&1 &
	"$bins/kube-proxy" --config="$nd/kube-proxy.yaml" --hostname-override="$(node_name "$i")" --v=2 \
		>"$nout/kube-proxy.log" 2>&1 &
	wait
	exit 0
fi

# ---------------------------------------------------------------------------
# Outside.
[ "$(id -u)" = 0 ] || { echo "e2e-cluster: run as root (berthd, the kubelets and the namespaces need it)" >&2; exit 1; }
mode=${1:-conformance}
case $mode in conformance | smoke | up) ;; *) echo "e2e-cluster: unknown mode $mode (conformance|smoke|up)" >&2; exit 2 ;; esac

hack/install-deps.sh e2e-cluster
bins=$(hack/k8s-bins.sh cluster)
make build >&2

# One cluster at a time on this machine: the namespaces have fixed names.
mkdir -p /run/berth-e2e-cluster
# Only this script holds the lock: what it starts in the background gets
# fd 8 closed (8>&-: the control plane, the nodes, the suite, incp's
# commands), so a run killed by SIGKILL leaves its daemons running but the
# lock free, and the next run reaps them (reap_stale).
exec 8>/run/berth-e2e-cluster/lock
flock -n 8 || { echo "e2e-cluster: another e2e-cluster run holds /run/berth-e2e-cluster/lock" >&2; exit 1; }
# What a run that could not tear down (SIGKILL, a crash of the machine's
# session) left: with the lock held, no run owns it. Its processes are in
# its cgroups (berth-e2e-cluster-<pid> whose pid is gone) or its network
# namespaces; then the namespaces, the cgroups, the scratch dirs.
reap_stale() {
	local d p ns pids
	while read -r mnt _ _; do
		for d in $(find "$mnt" -maxdepth 6 -type d -name 'berth-e2e-cluster-*' 2>/dev/null); do
			[ -d "/proc/${d##*-}" ] && continue
			log "removing what an earlier run left: cgroup $d"
			for _ in 1 2 3; do
				pids=$(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)
				[ -z "$pids" ] && break
				kill -KILL $pids 2>/dev/null
				sleep 1
			done
			find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
		done
	done < <(cgroup_mounts)
	for ns in "$CP_NS" $(for i in "${NODES[@]}"; do node_ns "$i"; done); do
		[ -e "/run/netns/$ns" ] || continue
		log "removing what an earlier run left: network namespace $ns"
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
		ip netns del "$ns"
	done
	for d in /tmp/berth-e2e-cluster.*; do
		[ -d "$d" ] || continue
		pgrep -f -- "$d" >/dev/null && continue
		awk -v w="$d" '$5 == w || index($5, w "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
		rm -rf "$d" && log "removing what an earlier run left: $d"
	done
}
reap_stale

out=${E2E_CLUSTER_OUT:-$repo/out/e2e-cluster/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/berth-e2e-cluster.XXXXXX)
chmod 755 "$work"
log "results in $out, scratch in $work, programs from $bins"

# The run's cgroups: berth-e2e-cluster-<pid>/{cp,n1,n2} below this
# process's own cgroup in every hierarchy.
cgname=berth-e2e-cluster-$$
mapfile -t cgdirs < <(own_cgroup_dirs "$cgname")
make_cgroups() {
	local d s
	for d in "${cgdirs[@]}"; do
		for s in "" /cp $(for i in "${NODES[@]}"; do echo "/n$i"; done); do
			make_cgroup "$d$s"
		done
	done
}
# incp [--bg] CMD...: CMD in the control plane's namespace and cgroup;
# with --bg in a session of its own (an interrupt reaches this script
# alone, whose teardown then stops everything in order).
incp() {
	local files=() d bg=()
	[ "$1" = --bg ] && bg=(setsid) && shift
	for d in "${cgdirs[@]}"; do files+=("$d/cp/cgroup.procs"); done
	bash -c 'n=$1; shift; for f in "${@:1:n}"; do echo $$ >"$f"; done; shift "$n"; exec "$@"' \
		sh ${#files[@]} "${files[@]}" "${bg[@]}" nsenter --net="/run/netns/$CP_NS" -- "$@" 8>&-
}
kc() { incp "$bins/kubectl" --kubeconfig "$work/pki/admin.conf" "$@"; }

# ---------------------------------------------------------------------------
# Teardown: on every exit. Each step is tried whatever the others did;
# what is left is said (and written to teardown.txt).
cleanup_done=
cleanup() {
	[ -n "$cleanup_done" ] && return 0
	cleanup_done=1
	set +e
	trap '' INT TERM
	log "tearing down ($(date -u +%T))"
	# The kubelets and kube-proxies first (a kubelet restarts what goes).
	for p in $(pids_in_cgroups); do
		case "$(cat "/proc/$p/comm" 2>/dev/null)" in kubelet | kube-proxy) kill -TERM "$p" 2>/dev/null ;; esac
	done
	sleep 2
	# Every pod through the CRI, then berthd.
	for i in "${NODES[@]}"; do
		sock=$work/n$i/berth.sock
		[ -S "$sock" ] || continue
		timeout 120 "$bins/crictl" --runtime-endpoint "unix://$sock" --timeout 60s rmp -a -f >>"$out/n$i/cleanup.log" 2>&1
	done
	for p in $(pids_in_cgroups); do
		case "$(cat "/proc/$p/comm" 2>/dev/null)" in berthd) kill -TERM "$p" 2>/dev/null ;; esac
	done
	for _ in $(seq 1 100); do
		pgrep_in berthd >/dev/null || break
		sleep 0.2
	done
	# Then whatever is left in the run's cgroups (the control plane, the
	# registry, the node shells, leftover pod processes).
	for _ in 1 2 3; do
		pids=$(pids_in_cgroups)
		[ -z "$pids" ] && break
		kill -TERM $pids 2>/dev/null
		sleep 2
		pids=$(pids_in_cgroups)
		[ -n "$pids" ] && kill -KILL $pids 2>/dev/null
		sleep 1
	done
	# The namespaces: veths, the bridges and every iptables rule of the
	# nodes go with their network namespace; the nodes' mounts went with
	# their last process.
	for ns in $(for i in "${NODES[@]}"; do node_ns "$i"; done) "$CP_NS"; do
		[ -e "/run/netns/$ns" ] && ip netns del "$ns"
	done
	for d in "${cgdirs[@]}"; do
		find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	# Mounts below the scratch dir, as the host sees them (none are made
	# there; a leftover would be a leak of a node's namespace).
	awk -v w="$work" '$5 == w || index($5, w "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
		umount -l "$m" && log "unmounted leftover $m"
	done
	rm -rf "$work"
	verify_clean | tee "$out/teardown.txt" >&2
	log "results in $out"
}
pids_in_cgroups() {
	local d
	for d in "${cgdirs[@]}"; do
		[ -d "$d" ] && find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -un | grep -vx "$$" || true
}
pgrep_in() { # NAME: pids in the run's cgroups whose comm is NAME
	local p found=1
	for p in $(pids_in_cgroups); do
		[ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$1" ] && echo "$p" && found=0
	done
	return $found
}
verify_clean() {
	local left=0 p d ns
	for p in $(pids_in_cgroups) $(grep -l -s -- "$work" /proc/[0-9]*/cmdline | cut -d/ -f3); do
		[ "$p" = $$ ] && continue
		[ -d "/proc/$p" ] || continue
		echo "left: process $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-200)"
		left=1
	done
	for ns in $(for i in "${NODES[@]}"; do node_ns "$i"; done) "$CP_NS"; do
		[ -e "/run/netns/$ns" ] && echo "left: network namespace $ns" && left=1
	done
	for d in "${cgdirs[@]}"; do
		[ -d "$d" ] && echo "left: cgroup $d" && left=1
	done
	if ip -o link show | grep -E "berthc|veth-n[0-9]" ; then
		echo "left: links on the host (above)"
		left=1
	fi
	# The host's rules of the kinds the nodes make, against those there
	# before the run (another kubelet on the host may have its own).
	if host_rules | comm -13 "$out/host-iptables-before.txt" - | grep . ; then
		echo "left: iptables rules on the host (above)"
		left=1
	fi
	if grep -E "$work|berthc" /proc/self/mountinfo; then
		echo "left: mounts (above)"
		left=1
	fi
	[ -d "$work" ] && echo "left: $work" && left=1
	if [ $left = 0 ]; then
		echo "teardown: nothing left (processes, network namespaces, links, host iptables rules, mounts, cgroups, scratch dir)"
	fi
}
# (grep finds nothing on a host that never ran kube-proxy or CNI: not an error)
host_rules() { iptables-save 2>/dev/null | { grep -E "KUBE-|CNI-|berthc|$POD_NET\.|10\.96\." || true; } | sed 's/\[[0-9]*:[0-9]*\]//' | sort -u; }
host_rules >"$out/host-iptables-before.txt"
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

make_cgroups

# ---------------------------------------------------------------------------
# Certificates and kubeconfigs.
pki=$work/pki
mkdir -p "$pki"
(
	cd "$pki"
	ca() { # NAME CN
		openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.crt" -days 2 -subj "/CN=$2" \
			-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
	}
	cert() { # NAME CA SUBJECT EXT [SAN]
		openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$3" 2>/dev/null
		{
			echo "basicConstraints=critical,CA:FALSE"
			echo "keyUsage=critical,digitalSignature,keyEncipherment"
			echo "extendedKeyUsage=$4"
			[ -n "${5:-}" ] && echo "subjectAltName=$5"
		} >"$1.ext"
		openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 2 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
		rm -f "$1.csr" "$1.ext"
	}
	ca ca berth-e2e-cluster-ca
	ca front-proxy-ca berth-e2e-cluster-front-proxy-ca
	cert apiserver ca /CN=kube-apiserver serverAuth \
		"DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$CP_IP,IP:$SVC_API,IP:127.0.0.1"
	cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
	cert front-proxy-client front-proxy-ca /CN=front-proxy-client clientAuth
	cert admin ca "/O=system:masters/CN=kubernetes-admin" clientAuth
	cert controller-manager ca /CN=system:kube-controller-manager clientAuth
	cert scheduler ca /CN=system:kube-scheduler clientAuth
	cert kube-proxy ca /CN=system:kube-proxy clientAuth
	for i in "${NODES[@]}"; do
		cert "kubelet-n$i" ca "/O=system:nodes/CN=system:node:$(node_name "$i")" clientAuth
	done
	openssl genrsa -out sa.key 2048 2>/dev/null
	openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
	kubeconfig() { # NAME USER-CERT
		cat >"$1.conf" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: berth
  cluster:
    server: https://$CP_IP:6443
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: berth
  context: {cluster: berth, user: $2}
current-context: berth
EOF
	}
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig kube-proxy kube-proxy
	for i in "${NODES[@]}"; do kubeconfig "kubelet-n$i" "kubelet-n$i"; done
)
cp "$pki/admin.conf" "$out/admin.conf"

# ---------------------------------------------------------------------------
# The network: the control plane's namespace with the bridge, a namespace
# per node with a veth on it.
ip netns add "$CP_NS"
ip -n "$CP_NS" link set lo up
ip -n "$CP_NS" link add "$BRIDGE" type bridge
ip -n "$CP_NS" addr add "$CP_IP/24" dev "$BRIDGE"
ip -n "$CP_NS" link set "$BRIDGE" up
nsenter --net="/run/netns/$CP_NS" sysctl -qw net.ipv4.ip_forward=1
for i in "${NODES[@]}"; do
	ns=$(node_ns "$i")
	ip netns add "$ns"
	ip -n "$CP_NS" link add "veth-n$i" type veth peer name eth0 netns "$ns"
	ip -n "$CP_NS" link set "veth-n$i" master "$BRIDGE" up
	ip -n "$ns" addr add "$(node_ip "$i")/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" route add default via "$CP_IP"
	ip -n "$CP_NS" route add "$POD_NET.$i.0/24" via "$(node_ip "$i")"
	for j in "${NODES[@]}"; do
		[ "$j" = "$i" ] && continue
		ip -n "$ns" route add "$POD_NET.$j.0/24" via "$(node_ip "$j")"
	done
done

# ---------------------------------------------------------------------------
# The control plane.
mkdir -p "$out/cp" "$work/etcd"
incp --bg "$bins/etcd" --name cp --data-dir "$work/etcd" --listen-client-urls http://127.0.0.1:2379 \
	--advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
	--initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster cp=http://127.0.0.1:2380 \
	--listen-metrics-urls http://127.0.0.1:2381 --unsafe-no-fsync --snapshot-count 10000 \
	>"$out/cp/etcd.log" 2>&1 8>&- &
wait_http() { # WHAT URL [TRIES]: until URL answers 200 (in the control plane's namespace)
	local n=${3:-600}
	for _ in $(seq 1 "$n"); do
		incp curl -fsk --max-time 2 -o /dev/null "$2" 2>/dev/null && return 0
		sleep 0.5
	done
	log "$1 did not come up ($2)"
	return 1
}
wait_http etcd http://127.0.0.1:2381/health
incp --bg "$bins/kube-apiserver" \
	--advertise-address="$CP_IP" --secure-port=6443 --etcd-servers=http://127.0.0.1:2379 \
	--service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
	--client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
	--kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
	--kubelet-preferred-address-types=InternalIP \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
	--enable-aggregator-routing=true \
	--requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
	--requestheader-extra-headers-prefix=X-Remote-Extra- --requestheader-group-headers=X-Remote-Group \
	--requestheader-username-headers=X-Remote-User \
	--proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
	--profiling=false --v=2 >"$out/cp/kube-apiserver.log" 2>&1 8>&- &
wait_http kube-apiserver "https://$CP_IP:6443/readyz"
incp --bg "$bins/kube-controller-manager" \
	--kubeconfig="$pki/controller-manager.conf" --authentication-kubeconfig="$pki/controller-manager.conf" \
	--authorization-kubeconfig="$pki/controller-manager.conf" --bind-address=127.0.0.1 --leader-elect=false \
	--client-ca-file="$pki/ca.crt" --requestheader-client-ca-file="$pki/front-proxy-ca.crt" \
	--cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" --root-ca-file="$pki/ca.crt" \
	--service-account-private-key-file="$pki/sa.key" --use-service-account-credentials=true \
	--controllers='*,bootstrapsigner,tokencleaner' --cluster-name=berth \
	--allocate-node-cidrs=false --cluster-cidr="$POD_NET.0.0/16" --service-cluster-ip-range="$SVC_CIDR" \
	--profiling=false --v=2 >"$out/cp/kube-controller-manager.log" 2>&1 8>&- &
incp --bg "$bins/kube-scheduler" \
	--kubeconfig="$pki/scheduler.conf" --authentication-kubeconfig="$pki/scheduler.conf" \
	--authorization-kubeconfig="$pki/scheduler.conf" --bind-address=127.0.0.1 --leader-elect=false \
	--profiling=false --v=2 >"$out/cp/kube-scheduler.log" 2>&1 8>&- &
wait_http kube-controller-manager https://127.0.0.1:10257/healthz
wait_http kube-scheduler https://127.0.0.1:10259/healthz

# ---------------------------------------------------------------------------
# The registry of stand-in images, on the bridge; every node's berthd
# mirrors the public registries to it.
kmod=$(cd test/k8s && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
CGO_ENABLED=0 go build -o "$work/imagetools" ./test/e2enode/imagetools
go build -o "$work/registry" ./test/e2enode/registry
incp --bg "$work/registry" -addr "$CP_IP:$REG_PORT" -agnhost "$bins/agnhost" -imagetools "$work/imagetools" \
	-porter-dir "$kmod/test/images/agnhost/porter" -sample-device-plugin "$bins/sample-device-plugin" \
	-coredns "$bins/coredns" -sample-apiserver "$bins/sample-apiserver" -etcd "$bins/etcd" >"$out/cp/registry.log" 2>&1 8>&- &
for _ in $(seq 1 600); do
	grep -qs '^READY' "$out/cp/registry.log" && break
	sleep 0.1
done
grep -q '^READY' "$out/cp/registry.log" || { log "the stand-in registry did not start:"; tail "$out/cp/registry.log" >&2; exit 1; }
write_mirrors "$work/certs.d" "$CP_IP:$REG_PORT"

# ---------------------------------------------------------------------------
# The nodes. Each Node object is made before its kubelet registers, with
# its pod CIDR: the CNI conflist names that range before berthd starts, so
# the node never runs a pod on anything else.
mkdir -p /var/lib/kubelet
for i in "${NODES[@]}"; do
	nd=$work/n$i
	name=$(node_name "$i")
	mkdir -p "$nd/kubelet" "$nd/log" "$nd/net.d" "$nd/nri-plugins" "$nd/nri-conf" "$out/n$i"
	od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$nd/machine-id"
	echo >>"$nd/machine-id"
	cp "$pki/kubelet-n$i.conf" "$nd/kubelet.conf"
	# No upstream resolver: nothing may leave the machine.
	echo "nameserver $CP_IP" >"$nd/resolv.conf"
	cat >"$nd/net.d/10-berthc.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "berthc",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_NET.$i.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$nd/cni-ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	cat >"$nd/berth.toml" <<EOF
listen = "unix://$nd/berth.sock"
root = "$nd/berth-root"
state = "$nd/berth-state"
cni_conf_dir = "$nd/net.d"
cni_bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
registry_config_dir = "$work/certs.d"
signature_policy = ""
cgroup_driver = "cgroupfs"

[nri]
  socket_path = "$nd/nri.sock"
  plugin_path = "$nd/nri-plugins"
  plugin_config_path = "$nd/nri-conf"
EOF
	# kind's kubelet settings for nodes sharing one disk: no image GC, no
	# eviction.
	cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /
cgroupsPerQOS: true
failSwapOn: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $pki/ca.crt
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: $nd/resolv.conf
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
rotateCertificates: false
EOF
	cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: $pki/kube-proxy.conf
clusterCIDR: $POD_NET.0.0/16
detectLocalMode: ClusterCIDR
bindAddress: $(node_ip "$i")
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
# Host-wide conntrack settings are not a node's to change.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
	kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $name
  labels:
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
spec:
  podCIDR: $POD_NET.$i.0/24
  podCIDRs: [$POD_NET.$i.0/24]
EOF
	files=()
	for d in "${cgdirs[@]}"; do files+=("$d/n$i/cgroup.procs"); done
	BERTH_CLUSTER_WORK=$work BERTH_CLUSTER_BINS=$bins BERTH_CLUSTER_OUT=$out \
		bash -c 'n=$1; shift; for f in "${@:1:n}"; do echo $$ >"$f"; done; shift "$n"; exec "$@"' \
		sh ${#files[@]} "${files[@]}" setsid nsenter --net="/run/netns/$(node_ns "$i")" -- \
		unshare --mount --uts --cgroup --propagation slave -- "$repo/hack/e2e-cluster.sh" node-inner "$i" \
		>"$out/n$i/node.log" 2>&1 8>&- &
done

# Cluster DNS: CoreDNS as kubeadm deploys it, without forward.
kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 2
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector:
                matchLabels: {k8s-app: kube-dns}
              topologyKey: kubernetes.io/hostname
      containers:
      - name: coredns
        image: $COREDNS_IMAGE
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        - {containerPort: 9153, name: metrics, protocol: TCP}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities:
            add: [NET_BIND_SERVICE]
            drop: [ALL]
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 60
          timeoutSeconds: 5
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
        volumeMounts:
        - {name: config-volume, mountPath: /etc/coredns, readOnly: true}
      dnsPolicy: Default
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items:
          - {key: Corefile, path: Corefile}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: $DNS_IP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
EOF

log "waiting for both nodes to be Ready ($(date -u +%T))"
for _ in $(seq 1 120); do
	ready=$(kc get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c True || true)
	[ "$ready" = "${#NODES[@]}" ] && break
	sleep 2
done
kc get nodes -o wide | tee "$out/nodes.txt" >&2
[ "$ready" = "${#NODES[@]}" ] || { log "nodes not Ready"; exit 1; }
log "waiting for CoreDNS ($(date -u +%T))"
kc -n kube-system rollout status deployment/coredns --timeout=300s >&2

# ---------------------------------------------------------------------------
# Smoke: a pod on each node, pod to pod across nodes, a ClusterIP Service
# through kube-proxy, a name through CoreDNS.
smoke() {
	local s=$out/smoke.txt
	: >"$s"
	kc create namespace smoke >/dev/null
	for i in "${NODES[@]}"; do
		kc -n smoke apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: web-$i
  labels: {app: web}
spec:
  nodeName: $(node_name "$i")
  containers:
  - name: web
    image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
    args: ["netexec", "--http-port=8080"]
EOF
	done
	kc -n smoke expose pod web-1 --name web --port 80 --target-port 8080 --selector app=web >/dev/null
	kc -n smoke wait --for=condition=Ready pod/web-1 pod/web-2 --timeout=300s >&2
	kc -n smoke get pods -o wide | tee -a "$s" >&2
	local ip2 svc
	ip2=$(kc -n smoke get pod web-2 -o jsonpath='{.status.podIP}')
	svc=$(kc -n smoke get service web -o jsonpath='{.spec.clusterIP}')
	check() { # WHAT CMD...: runs in web-1 (node 1); tried for up to a minute
		# (a new Service's rules reach kube-proxy after its endpoints do)
		local what=$1 got ok=
		shift
		for _ in $(seq 1 30); do
			got=$(kc -n smoke exec web-1 -- "$@" 2>&1) && ok=1 && break
			sleep 2
		done
		if [ -n "$ok" ]; then
			echo "ok: $what: $(echo "$got" | tr '\n' ' ' | cut -c1-200)" | tee -a "$s" >&2
		else
			echo "FAIL: $what: $(echo "$got" | tr '\n' ' ' | cut -c1-300)" | tee -a "$s" >&2
			smoke_failed=1
		fi
	}
	smoke_failed=
	check "pod to pod across nodes (web-1 -> web-2 $ip2:8080/hostname)" curl -f -s -S --max-time 10 "http://$ip2:8080/hostname"
	check "ClusterIP service (web $svc:80, kube-proxy)" curl -f -s -S --max-time 10 "http://$svc:80/hostname"
	check "DNS web.smoke.svc.cluster.local" nslookup web.smoke.svc.cluster.local
	check "DNS kubernetes.default.svc.cluster.local" nslookup kubernetes.default.svc.cluster.local
	check "the pod's resolv.conf (cluster DNS, search path)" grep -x -e "nameserver $DNS_IP" -e "search smoke.svc.cluster.local svc.cluster.local cluster.local" /etc/resolv.conf
	check "the API server through its ClusterIP ($SVC_API:443)" curl -f -s -S -k --max-time 10 "https://$SVC_API:443/version"
	kc delete namespace smoke --wait=false >/dev/null
	[ -z "$smoke_failed" ]
}
status=0
smoke || status=1
if [ "$mode" = up ]; then
	log "cluster up; kubectl: nsenter --net=/run/netns/$CP_NS $bins/kubectl --kubeconfig $pki/admin.conf get nodes"
	log "Ctrl-C (or kill $$) tears it down"
	while true; do sleep 3600 8>&- & wait $!; done
fi
[ "$mode" = smoke ] && exit $status

# ---------------------------------------------------------------------------
# The suite: the parallel pass (no [Serial]) then the serial pass, as
# kind's conformance job runs them.
"$bins/e2e.test" --list-images >"$out/images.txt" 2>/dev/null || true
# The framework's tags ([Conformance], [Serial]) are ginkgo labels too;
# E2E_CLUSTER_FOCUS narrows both passes by spec text.
focus=()
[ -n "${E2E_CLUSTER_FOCUS:-}" ] && focus=(--focus="$E2E_CLUSTER_FOCUS")
run_pass() { # NAME GINKGO-FLAGS...
	local name=$1
	shift
	mkdir -p "$out/$name"
	log "pass $name ($(date -u +%T))"
	incp "$bins/ginkgo" --no-color --timeout="${E2E_CLUSTER_TIMEOUT:-6h}" --output-dir="$out/$name" --json-report=report.json \
		--junit-report=junit.xml --silence-skips "$@" "$bins/e2e.test" -- \
		--kubeconfig="$pki/admin.conf" --kubectl-path="$bins/kubectl" --provider=skeleton --num-nodes=2 \
		--report-dir="$out/$name" \
		${E2E_CLUSTER_ARGS:-} >"$out/$name/e2e.log" 2>&1 8>&- &
	# In the background: an interrupt or TERM runs the teardown at once
	# (bash runs a trap only after the foreground command ends).
	wait $! || status=1
	log "pass $name done ($(date -u +%T)): $(grep -aE '^(Ran |SUCCESS|FAIL)' "$out/$name/e2e.log" | tr '\n' ' ')"
}
passes=${E2E_CLUSTER_PASSES:-both}
if [ "$passes" = both ] || [ "$passes" = parallel ]; then
	run_pass parallel --procs="${E2E_CLUSTER_PROCS:-8}" --label-filter='Conformance && !Serial' "${focus[@]}"
fi
if [ "$passes" = both ] || [ "$passes" = serial ]; then
	run_pass serial --label-filter='Conformance && Serial' "${focus[@]}"
fi
summarize_passes "$out"
exit $status
