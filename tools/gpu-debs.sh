#!/usr/bin/env bash
# gpu-debs.sh - run HERE (a Debian 12 x86-64 machine with apt and network),
# before a device session: downloads into .debs/ (ignored by git) the .deb
# files of the C libraries sluice builds against, at the versions apt would
# install here.  The GPU machine has no network and lacks them; carry .debs
# there (the device tool's carry: [".debs"]) and tools/gpu-check.sh unpacks
# them into a private prefix (never into /) when pkg-config cannot find them.
#
# Usage: tools/gpu-debs.sh          (re-run: replaces .debs/ wholesale)
#
# The list: every package whose headers, .pc file or shared library the
# build or the test programs use, plus the shared libraries those need that a
# CUDA image may lack.  Left out on purpose: libgomp1, libgcc-s1, libc6-dev,
# linux-libc-dev (gcc, which nvcc needs, brings them); libnuma-dev and
# libltdl-dev (libhwloc-dev's Depends, but sluice only asks pkg-config for
# hwloc and links nothing of it); mawk (check's checkmk script).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.debs"

pkgs=(
	pkgconf-bin libpkgconf3 # pkg-config itself (the binary is pkgconf)
	check libsubunit-dev libsubunit0
	libjansson-dev libjansson4
	libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0
	liburing-dev liburing2
	libhwloc-dev libhwloc15 libudev1
)

if [[ $(dpkg --print-architecture) != amd64 ]]; then
	echo "gpu-debs.sh: this machine is $(dpkg --print-architecture); the GPU machine is amd64" >&2
	exit 1
fi

rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"
# apt-get download fetches the candidate version (what apt-get install would
# take here); a stale package list can name a file the mirror no longer has,
# so refresh the lists once and try again.
if ! apt-get download "${pkgs[@]}"; then
	echo "gpu-debs.sh: download failed; refreshing the package lists" >&2
	sudo_cmd=""
	[[ $(id -u) -ne 0 ]] && sudo_cmd=sudo
	$sudo_cmd apt-get update -qq
	apt-get download "${pkgs[@]}"
fi

n=$(find . -maxdepth 1 -name '*.deb' | wc -l)
if ((n != ${#pkgs[@]})); then
	echo "gpu-debs.sh: expected ${#pkgs[@]} .deb files, got $n" >&2
	exit 1
fi
printf '%s\n' *.deb
bytes=$(cat ./*.deb | wc -c)
echo "gpu-debs.sh: $n packages, $((bytes / 1024)) KiB in $dir"
if ((bytes > 40 * 1024 * 1024)); then
	echo "gpu-debs.sh: over 40 MiB; the device run carries at most 64 MiB with the tree" >&2
	exit 1
fi
