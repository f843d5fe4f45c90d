#!/usr/bin/env bash
# tools/test.sh - build sluice and run every test, then run them all again
# under AddressSanitizer and UndefinedBehaviorSanitizer, then cross-build for
# aarch64 and run the op tests there under qemu-user.  Installs what is
# missing.  Warnings are errors here.  CUDA code is compiled and linked
# where nvcc is found; GPU tests skip (exit 77) where there is no GPU.
# Exit status: non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/deps.sh
. tools/deps.sh

jobs=$(nproc)
status=0
run_suite() { # name builddir meson-args...
	local name=$1 dir=$2
	shift 2
	echo "== $name: configure and build ($dir)"
	if [ -f "$dir/build.ninja" ]; then
		meson configure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@" >/dev/null
	fi
	ninja -C "$dir" -j "$jobs"
	echo "== $name: tests"
	if ! meson test -C "$dir" --print-errorlogs --num-processes 1; then
		status=1
	fi
}

# shellcheck disable=SC2086
run_suite "release" build-test -Dwerror=true -Dbuildtype=release $SLUICE_MESON_ARGS
# The sanitizer build leaves CUDA out: nothing here can run it, and nvcc's
# host objects are not instrumented.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
# shellcheck disable=SC2086
run_suite "asan+ubsan" build-asan -Dwerror=true -Dbuildtype=debugoptimized -Dcuda=disabled \
	-Db_sanitize=address,undefined -Db_lundef=false $SLUICE_MESON_ARGS

# aarch64 (the CPU of a GH200, say): everything cross-compiled with
# Debian's cross compiler against the arm64 libraries of its multiarch,
# warnings as errors, and the kernels' tests run under qemu-user (the
# portable kernels; tests/test_ops.c also runs them on this machine).
# SLUICE_CROSS=0 leaves it out; it needs an x86-64 Debian machine.
if [ "${SLUICE_CROSS:-1}" != 0 ] && [ "$(uname -m)" = x86_64 ] && command -v apt-get >/dev/null; then
	sluice_cross_deps
	unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
	echo "== aarch64: cross-compile (build-aarch64) and run the op tests under qemu-user"
	[ -f build-aarch64/build.ninja ] ||
		meson setup build-aarch64 --cross-file tools/cross/aarch64-linux-gnu.ini -Dcuda=disabled \
			-Dwerror=true -Dbuildtype=release -Dopenblas=disabled >/dev/null
	ninja -C build-aarch64 -j "$jobs"
	if ! SL_OPS_STRIDE=6 meson test -C build-aarch64 --print-errorlogs --num-processes 1 \
		--timeout-multiplier 3 ops; then
		status=1
	fi
	cross_log=build-aarch64
fi

passed=0 failed=0 skipped=0
for d in build-test build-asan ${cross_log:-}; do
	f="$d/meson-logs/testlog.json"
	[ -f "$f" ] || continue
	passed=$((passed + $(grep -c '"result": "OK"' "$f" || true)))
	failed=$((failed + $(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR)"' "$f" || true)))
	skipped=$((skipped + $(grep -c '"result": "SKIP"' "$f" || true)))
done
# every skipped test, with the reason it gave
python3 tools/skipped_tests.py build-test/meson-logs/testlog.json build-asan/meson-logs/testlog.json
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ] || status=1
exit $status
