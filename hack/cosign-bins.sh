#!/usr/bin/env bash
# Builds the cosign CLI the signature policy tests use (cosign-v2 and
# cosign-v3, from the modules pinned in test/cosign) into a cache
# directory that later runs reuse, and prints that directory.
#
#   BERTH_COSIGN_DIR=$(hack/cosign-bins.sh) go test -run CosignCLI ./test/integration/
#
# The directory is ${BERTH_COSIGN_CACHE:-/var/cache/berth-cosign}/<key>,
# <key> a hash of test/cosign's go.mod and go.sum and the Go version, so a
# bump builds afresh beside the old one. The second build reuses what the
# first compiled (most of their packages; about 6 min in all on 2 busy cores).
# Progress goes to stderr, the directory alone to stdout.
set -euo pipefail

cd "$(dirname "$(readlink -f "$0")")/.."
GO=${GO:-go}
key=$(cat test/cosign/go.mod test/cosign/go.sum <("$GO" env GOVERSION GOARCH) | sha256sum | cut -c1-12)
out=${BERTH_COSIGN_CACHE:-/var/cache/berth-cosign}/$key
mkdir -p "$out"
built() { [ -x "$out/cosign-v2" ] && [ -x "$out/cosign-v3" ]; }
if built; then
	echo "$out"
	exit 0
fi
# One build at a time per directory.
exec 9>"$out/.lock"
flock 9
if built; then
	echo "$out"
	exit 0
fi
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "cosign-bins: building cosign v2 and v3 ..." >&2
start=$(date +%s)
(
	cd test/cosign
	export CGO_ENABLED=0
	"$GO" build -trimpath -ldflags "-s -w" -o "$tmp/v2/" github.com/sigstore/cosign/v2/cmd/cosign
	"$GO" build -trimpath -ldflags "-s -w" -o "$tmp/v3/" github.com/sigstore/cosign/v3/cmd/cosign
) >&2
mv -f "$tmp/v2/cosign" "$out/cosign-v2"
mv -f "$tmp/v3/cosign" "$out/cosign-v3"
echo "cosign-bins: built in $(($(date +%s) - start))s" >&2
echo "$out"
