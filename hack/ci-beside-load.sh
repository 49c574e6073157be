#!/bin/bash
# CI's run on a fresh clone of HEAD beside a CPU-bound job: a test that
# passes alone and fails here is a bug (docs/reliability.md, "CI beside a
# CPU-bound job"). Usage: hack/ci-beside-load.sh [DIR] (default: a new
# temporary dir; the clone is left there for its logs and removed by you).
set -u
repo=$(git rev-parse --show-toplevel)
dir=${1:-$(mktemp -d /var/tmp/berth-ci-XXXXXX)}
rm -rf "$dir"
git clone -q "$repo" "$dir" || exit 1
bash -c 'while :; do :; done' &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
cd "$dir"
echo "== $(git rev-parse --short HEAD) in $dir, start $(date +%T)"
start=$(date +%s)
CI=true bash .ci/run
rc=$?
echo "== end $(date +%T), $(( $(date +%s) - start )) s, rc=$rc"
exit $rc
