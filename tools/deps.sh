#!/usr/bin/env bash
# tools/deps.sh - installs (apt-get) what sluice needs to build and test,
# only where something is missing.  Sourced by tools/test.sh and tools/demo.sh.
# Exports SLUICE_MESON_ARGS: the pkg-config path of the OpenMP build of
# OpenBLAS (for --cpu-gemm openblas), which shares sluice's thread pool (the
# pthreads build would fight it for the cores).
sluice_deps() {
	local need=()
	command -v meson >/dev/null || need+=(meson)
	command -v ninja >/dev/null || need+=(ninja-build)
	command -v pkg-config >/dev/null || need+=(pkg-config)
	command -v cc >/dev/null || need+=(gcc)
	command -v python3 >/dev/null || need+=(python3)
	# the zstd tool: tests make .jsonl.zst inputs with it, and
	# tools/merge_shards.py reads .zst shards through it
	command -v zstd >/dev/null || need+=(zstd)
	local pc
	for pc in liburing:liburing-dev hwloc:libhwloc-dev check:check \
		jansson:libjansson-dev libzstd:libzstd-dev; do
		pkg-config --exists "${pc%%:*}" 2>/dev/null || need+=("${pc#*:}")
	done
	[ -f "/usr/lib/$(uname -m)-linux-gnu/openblas-openmp/pkgconfig/openblas.pc" ] ||
		need+=(libopenblas-openmp-dev)
	[ -f /usr/include/subunit/child.h ] || need+=(libsubunit-dev)
	if [ ${#need[@]} -gt 0 ]; then
		echo "tools/deps.sh: installing ${need[*]}" >&2
		local sudo=""
		[ "$(id -u)" -eq 0 ] || sudo=sudo
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
	fi
	SLUICE_MESON_ARGS="-Dpkg_config_path=/usr/lib/$(uname -m)-linux-gnu/openblas-openmp/pkgconfig"
	export SLUICE_MESON_ARGS
}
# What tools/test.sh's aarch64 cross build needs: Debian's cross compiler,
# qemu-user to run its tests, and the arm64 builds of the libraries (from
# Debian's multiarch: dpkg --add-architecture arm64; not OpenBLAS, which
# only --cpu-gemm openblas uses).  Only what is missing.
sluice_cross_deps() {
	local need=() p sudo=""
	command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
	command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
	for p in libjansson-dev liburing-dev libzstd-dev libhwloc-dev check libsubunit-dev \
		libgomp1; do
		dpkg-query -W -f='${Status}' "$p:arm64" 2>/dev/null | grep -q ' installed' ||
			need+=("$p:arm64")
	done
	[ ${#need[@]} -gt 0 ] || return 0
	echo "tools/deps.sh: installing ${need[*]}" >&2
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		"${need[@]}" >/dev/null
}
sluice_deps
