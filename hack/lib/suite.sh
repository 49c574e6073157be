# Shared by hack/conformance.sh, hack/e2e-node.sh and hack/e2e-cluster.sh
# (sourced): the stand-in registry as every public registry's mirror, and
# the summary of a suite run's passes.

# write_mirrors DIR ADDR: DIR/<host>/hosts.toml (berthd's
# registry_config_dir) sending pulls from the public registries the suites
# name to the stand-in registry at ADDR (host:port, plain HTTP).
write_mirrors() {
	local dir=$1 addr=$2 host server
	for host in registry.k8s.io gcr.io k8s.gcr.io docker.io quay.io; do
		mkdir -p "$dir/$host"
		server=https://$host
		[ "$host" = docker.io ] && server=https://registry-1.docker.io
		cat >"$dir/$host/hosts.toml" <<EOT
server = "$server"

[host."http://$addr"]
  capabilities = ["pull", "resolve"]
EOT
	done
}

# summarize_passes OUT: the summary (test/e2enode/summary) of the passes
# that wrote a report, OUT/parallel and OUT/serial, into OUT/summary.txt
# and standard output.
summarize_passes() {
	local out=$1 r reports=()
	for r in "$out"/parallel/report.json "$out"/serial/report.json; do [ -f "$r" ] && reports+=("$r"); done
	if [ ${#reports[@]} -gt 0 ]; then
		go run ./test/e2enode/summary "${reports[@]}" | tee "$out/summary.txt"
	fi
}
