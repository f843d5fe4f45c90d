#!/usr/bin/env bash
# run-emu-tests.sh [BUILDDIR] - build the CUDA backend's own sources with g++
# against the CPU emulation in this folder (cuda_emu.h: kernels run as
# fibers, cuBLAS as OpenBLAS's sgemm) and run tests/test_cross_backend on it,
# so the backend's launchers and kernels are checked against the CPU backend
# on a machine without a GPU or nvcc.  Every case runs, the big ones too
# (SL_CROSS_SMALL=1 skips them).  Needs gcc/g++, OpenBLAS, OpenMP and Check.
#
#   EMU_SANITIZE=1  also build with AddressSanitizer + UBSan (out-of-bounds
#                   device accesses show as host heap overflows).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=${1:-$root/build-emu}
mkdir -p "$out/obj"

flags=(-O2 -g -fno-strict-aliasing -D_GNU_SOURCE -fopenmp -pthread)
if [[ "${EMU_SANITIZE:-0}" == 1 ]]; then
	flags+=(-fsanitize=address,undefined -fno-omit-frame-pointer)
fi
inc=(-I"$out" -I"$root/common" -I"$root/kernels" -I"$root/kernels/cuda")
blas_cflags=$(pkg-config --cflags openblas 2>/dev/null || true)
blas_libs=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
check_libs=$(pkg-config --libs check 2>/dev/null || echo "-lcheck -lsubunit -lrt -lm")

cat >"$out/sl_config.h" <<'EOF'
#define SL_HAVE_CUDA 1
#define SL_VERSION "emu"
EOF

objs=()
cc_one() { # compiler, source, extra flags...
	local comp=$1 src=$2
	shift 2
	local obj="$out/obj/$(echo "${src#"$root"/}" | tr '/' '_').o"
	"$comp" "${flags[@]}" "${inc[@]}" $blas_cflags "$@" -c "$src" -o "$obj"
	objs+=("$obj")
}

cc_one gcc "$root/common/sl_common.c" -std=c11
cc_one gcc "$root/kernels/backend.c" -std=c11
cc_one gcc "$root/kernels/rope_freq.c" -std=c11
for f in "$root"/kernels/cpu/*.c; do
	cc_one gcc "$f" -std=c11
done
cc_one gcc "$root/tests/test_cross_backend.c" -std=c11
for f in "$root"/kernels/cuda/*.cu; do
	cc_one g++ "$f" -x c++ -std=c++17 -DSL_CU_EMU -Wno-unknown-pragmas
done
cc_one g++ "$here/cuda_emu.cc" -std=c++17 -DSL_CU_EMU

g++ "${flags[@]}" -o "$out/test_cross_backend_emu" "${objs[@]}" $blas_libs $check_libs -lm
echo "built $out/test_cross_backend_emu"
cd "$root"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} "$out/test_cross_backend_emu"
