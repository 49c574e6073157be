# Cgroup helpers shared by hack/e2e-node.sh and hack/e2e-cluster.sh (sourced).

# cgroup_mounts prints "mountpoint fstype options" for every cgroup (v1)
# and cgroup2 mount of this process.
cgroup_mounts() {
	awk '{for (i = 7; $i != "-"; i++) {}; if ($(i+1) == "cgroup" || $(i+1) == "cgroup2") print $5, $(i+1), $(i+3)}' /proc/self/mountinfo
}

# own_cgroup_dirs NAME prints, for every hierarchy this process is in,
# the directory NAME below this process's own cgroup (not created).
own_cgroup_dirs() {
	local mnt fstype opts own o
	while read -r mnt fstype opts; do
		if [ "$fstype" = cgroup2 ]; then
			own=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
		else
			own=
			for o in ${opts//,/ }; do
				[ "$o" = rw ] && continue
				own=$(awk -F: -v c="$o" '{n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3}' /proc/self/cgroup)
				[ -n "$own" ] && break
			done
		fi
		[ -n "$own" ] || continue
		echo "$mnt${own%/}/$1"
	done < <(cgroup_mounts)
}

# make_cgroup DIR creates DIR; in a v1 cpuset hierarchy it first gives it
# its parent's CPUs and memory nodes (a new cpuset has none).
make_cgroup() {
	mkdir -p "$1"
	if [ -f "$1/cpuset.cpus" ]; then
		cat "$(dirname "$1")/cpuset.cpus" >"$1/cpuset.cpus"
		cat "$(dirname "$1")/cpuset.mems" >"$1/cpuset.mems"
	fi
}
