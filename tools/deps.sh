#!/usr/bin/env bash
# tools/deps.sh - installs (apt-get) what sluice needs to build and test,
# only where something is missing.  Sourced by tools/test.sh and tools/demo.sh.
# Exports SLUICE_MESON_ARGS: the pkg-config path of the OpenMP build of
# OpenBLAS, which shares sluice's thread pool (the pthreads build would
# fight it for the cores).
sluice_deps() {
	local need=()
	command -v meson >/dev/null || need+=(meson)
	command -v ninja >/dev/null || need+=(ninja-build)
	command -v pkg-config >/dev/null || need+=(pkg-config)
	command -v cc >/dev/null || need+=(gcc)
	command -v python3 >/dev/null || need+=(python3)
	local pc
	for pc in liburing:liburing-dev libzstd:libzstd-dev hwloc:libhwloc-dev check:check \
		jansson:libjansson-dev; do
		pkg-config --exists "${pc%%:*}" 2>/dev/null || need+=("${pc#*:}")
	done
	[ -f /usr/lib/x86_64-linux-gnu/openblas-openmp/pkgconfig/openblas.pc ] ||
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
sluice_deps
