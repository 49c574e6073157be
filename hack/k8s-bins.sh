#!/usr/bin/env bash
# Builds the Kubernetes programs berth is tested with, from the modules
# pinned in test/k8s (and test/k8s/critest), into a cache directory that
# later runs reuse, and prints that directory.
#
#   hack/k8s-bins.sh                  # all: kubelet e2e_node.test agnhost ginkgo critest crictl sample-device-plugin
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
ALL=(kubelet e2e_node.test agnhost ginkgo critest crictl sample-device-plugin)
want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${ALL[@]}")
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

key=$(cat test/k8s/go.mod test/k8s/go.sum test/k8s/critest/go.mod test/k8s/critest/go.sum \
	<("$GO" env GOVERSION GOARCH) <(echo "$ldflags" "$crflags") | sha256sum | cut -c1-12)
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
	kubelet) mains+=(k8s.io/kubernetes/cmd/kubelet) ;;
	agnhost) mains+=(k8s.io/kubernetes/test/images/agnhost) ;;
	ginkgo) mains+=(github.com/onsi/ginkgo/v2/ginkgo) ;;
	# The node e2e suite's device plugin (the image
	# e2e-test-images/sample-device-plugin runs it).
	sample-device-plugin) mains+=(k8s.io/kubernetes/test/images/sample-device-plugin) ;;
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
case " ${todo[*]} " in
*" e2e_node.test "*)
	timed e2e_node.test bash -c 'cd test/k8s && exec "$0" test -c -trimpath -ldflags "$1" -o "$2/e2e_node.test" k8s.io/kubernetes/test/e2e_node' "$GO" "$ldflags" "$tmp"
	;;
esac
for w in "${todo[@]}"; do
	mv -f "$tmp/$w" "$out/$w"
done
echo "$out"
