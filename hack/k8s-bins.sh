#!/usr/bin/env bash
# Builds the Kubernetes programs berth is tested with, from the modules
# pinned in test/k8s (and test/k8s/critest), into a cache directory that
# later runs reuse, and prints that directory.
#
#   hack/k8s-bins.sh                  # the node set: kubelet e2e_node.test agnhost ginkgo critest crictl sample-device-plugin
#   hack/k8s-bins.sh cluster          # the cluster set (make e2e-cluster): the control plane, kube-proxy,
#                                     # kubectl, e2e.test, etcd and CoreDNS, with the node set's kubelet, agnhost,
#                                     # ginkgo, crictl, sample-device-plugin, sample-apiserver (the stand-in registry)
#   hack/k8s-bins.sh kubelet agnhost  # only these (others already there stay)
#   BIN=$(hack/k8s-bins.sh kubelet) && "$BIN/kubelet" --version
#
# The directory is ${BERTH_K8S_CACHE:-/var/cache/berth-k8s}/<version>-<key>,
# <key> a hash of the pinned modules (go.mod, go.sum of both modules), the Go
# version and the link flags, so a bump builds afresh beside the old one.
# Each program is built once; a missing one is built on the next call.
# Progress goes to stderr, the directory alone to stdout.
set -euo pipefail

cd "$(dirname "$(readlink -f "$0")")/.."
GO=${GO:-go}
NODE=(kubelet e2e_node.test agnhost ginkgo critest crictl sample-device-plugin)
CLUSTER=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kubelet e2e.test agnhost ginkgo crictl sample-device-plugin sample-apiserver etcd etcdctl coredns)
ALL=("${NODE[@]}" kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl e2e.test sample-apiserver etcd etcdctl coredns)
want=()
for w in "$@"; do
	case $w in
	cluster) want+=("${CLUSTER[@]}") ;;
	*) want+=("$w") ;;
	esac
done
[ ${#want[@]} -gt 0 ] || want=("${NODE[@]}")
for w in "${want[@]}"; do
	case " ${ALL[*]} " in *" $w "*) ;; *) echo "k8s-bins: unknown program $w (want: ${ALL[*]})" >&2; exit 2 ;; esac
done

version=$(awk '{sub(/^require[ \t]+/, "")} $1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' test/k8s/go.mod)
[ -n "$version" ] || { echo "k8s-bins: no k8s.io/kubernetes version in test/k8s/go.mod" >&2; exit 1; }
# Release builds: no debug info, paths trimmed, no race detector; cgo off
# as Kubernetes builds these. The version variables are what the kubelet
# reports (kubelet --version, the node's kubeletVersion) and what the e2e
# framework compares against.
minor=${version#v*.}; minor=${minor%%.*}
major=${version#v}; major=${major%%.*}
vpkgs="k8s.io/component-base/version k8s.io/client-go/pkg/version"
ldflags="-s -w"
for p in $vpkgs; do
	ldflags+=" -X $p.gitVersion=$version -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
crv=$(awk '{sub(/^require[ \t]+/, "")} $1 == "sigs.k8s.io/cri-tools" {print $2; exit}' test/k8s/critest/go.mod)
crflags="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crv"

# etcd and CoreDNS are modules of their own (test/k8s/etcd, test/k8s/coredns):
# etcd's module has replace directives, and neither belongs in the
# kubernetes module's graph. Their version variables are stamped as their
# own Makefiles do.
etcdv=$(awk '{sub(/^require[ \t]+/, "")} $1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' test/k8s/etcd/go.mod)
etcdflags="-s -w"
corev=$(awk '{sub(/^require[ \t]+/, "")} $1 == "github.com/coredns/coredns" {print $2; exit}' test/k8s/coredns/go.mod)
coreflags="-s -w"
key=$(cat test/k8s/go.mod test/k8s/go.sum test/k8s/critest/go.mod test/k8s/critest/go.sum \
	test/k8s/etcd/go.mod test/k8s/etcd/go.sum test/k8s/coredns/go.mod test/k8s/coredns/go.sum \
	<("$GO" env GOVERSION GOARCH) <(echo "$ldflags" "$crflags" "$etcdflags" "$coreflags") | sha256sum | cut -c1-12)
cache=${BERTH_K8S_CACHE:-/var/cache/berth-k8s}
out=$cache/$version-$key
mkdir -p "$out"

missing() {
	todo=()
	for w in "${want[@]}"; do [ -x "$out/$w" ] || todo+=("$w"); done
	[ ${#todo[@]} -gt 0 ]
}
# Programs appear in the directory only once built (renamed into place),
# so what is there can be used without waiting for a build of others.
if ! missing; then
	echo "$out"
	exit 0
fi
# One build at a time per directory: make test and make e2e-node may ask
# at once; the second waits and then finds the programs there.
exec 9>"$out/.lock"
flock 9
if ! missing; then
	echo "$out"
	exit 0
fi

export CGO_ENABLED=0
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

timed() { # name, command...: run it, record its wall time in build-times.txt
	local name=$1 start end
	shift
	echo "k8s-bins: building $name ..." >&2
	start=$(date +%s)
	"$@" >&2
	end=$(date +%s)
	echo "$name $((end - start))s $(date -u +%FT%TZ) $("$GO" env GOVERSION)" >>"$out/build-times.txt"
	echo "k8s-bins: $name built in $((end - start))s" >&2
}

# The mains of the kubernetes module in one go build: they share the
# compile of everything they have in common.
mains=()
for w in "${todo[@]}"; do
	case $w in
	kubelet | kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy | kubectl)
		mains+=(k8s.io/kubernetes/cmd/"$w")
		;;
	agnhost) mains+=(k8s.io/kubernetes/test/images/agnhost) ;;
	ginkgo) mains+=(github.com/onsi/ginkgo/v2/ginkgo) ;;
	# The node e2e suite's device plugin (the image
	# e2e-test-images/sample-device-plugin runs it).
	sample-device-plugin) mains+=(k8s.io/kubernetes/test/images/sample-device-plugin) ;;
	# The Aggregator spec's sample-apiserver (upstream's image 1.29.2; this
	# is the k8s.io/sample-apiserver module of the pinned release).
	sample-apiserver) mains+=(k8s.io/sample-apiserver) ;;
	esac
done
if [ ${#mains[@]} -gt 0 ]; then
	names=$(printf '%s\n' "${mains[@]##*/}" | paste -sd+)
	timed "$names" bash -c 'cd test/k8s && exec "$0" build -trimpath -ldflags "$1" -o "$2/" "${@:3}"' "$GO" "$ldflags" "$tmp" "${mains[@]}"
fi
# crictl and critest, in their own module; critest is a test binary, as
# upstream builds it.
for w in "${todo[@]}"; do
	case $w in
	crictl)
		timed crictl bash -c 'cd test/k8s/critest && exec "$0" build -trimpath -ldflags "$1" -o "$2/crictl" sigs.k8s.io/cri-tools/cmd/crictl' "$GO" "$crflags" "$tmp"
		;;
	critest)
		timed critest bash -c 'cd test/k8s/critest && exec "$0" test -c -trimpath -ldflags "$1" -o "$2/critest" sigs.k8s.io/cri-tools/cmd/critest' "$GO" "$crflags" "$tmp"
		;;
	esac
done
for w in "${todo[@]}"; do
	case $w in
	e2e_node.test)
		timed e2e_node.test bash -c 'cd test/k8s && exec "$0" test -c -trimpath -ldflags "$1" -o "$2/e2e_node.test" k8s.io/kubernetes/test/e2e_node' "$GO" "$ldflags" "$tmp"
		;;
	# The cluster suite (the [Conformance] specs among it), a test
	# binary as upstream builds it.
	e2e.test)
		timed e2e.test bash -c 'cd test/k8s && exec "$0" test -c -trimpath -ldflags "$1" -o "$2/e2e.test" k8s.io/kubernetes/test/e2e' "$GO" "$ldflags" "$tmp"
		;;
	# etcd's server module is its main package (server/main.go).
	etcd)
		timed etcd bash -c 'cd test/k8s/etcd && exec "$0" build -trimpath -ldflags "$1" -o "$2/etcd" go.etcd.io/etcd/server/v3' "$GO" "$etcdflags" "$tmp"
		;;
	etcdctl)
		timed etcdctl bash -c 'cd test/k8s/etcd && exec "$0" build -trimpath -ldflags "$1" -o "$2/etcdctl" go.etcd.io/etcd/etcdctl/v3' "$GO" "$etcdflags" "$tmp"
		;;
	coredns)
		timed coredns bash -c 'cd test/k8s/coredns && exec "$0" build -trimpath -ldflags "$1" -o "$2/coredns" github.com/coredns/coredns' "$GO" "$coreflags" "$tmp"
		;;
	esac
done
for w in "${todo[@]}"; do
	mv -f "$tmp/$w" "$out/$w"
done
echo "$out"
