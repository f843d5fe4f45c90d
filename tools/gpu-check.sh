#!/usr/bin/env bash
# gpu-check.sh OUTDIR - the one command for a machine with an NVIDIA GPU
# (target: H200): install what the build needs where it is missing,
# configure build-gpu with the CUDA backend, build, run every test (the
# cross-backend op tests compare the CUDA backend with the CPU one), run the
# benchmarks, and leave in OUTDIR
#   gpu-check.log  everything printed
#   results.json   machine, toolchain, build, test counts, each benchmark's
#                  status and JSON output
#   testlog.json   meson's per-test log (when the tests ran)
# then print a short summary table.  The 'emu' suite (the CUDA backend on
# the CPU emulation) is left out: the real GPU runs the same tests.  Meant to finish within 8 minutes; each
# stage has its own time limit.  Exit status: 0 when it built and no test
# failed (benchmarks may fail without changing it), 1 otherwise.
#
# Environment: GPU_ARCH (default 90), JOBS (default: all cores),
# GPU_CHECK_DEADLINE (seconds for the whole run, default 470),
# GPU_CHECK_BUILDDIR (default build-gpu), GPU_CHECK_DEBS (auto, all or off;
# see "build dependencies" below), GPU_CHECK_DEBS_PREFIX (/tmp/sluice-deps).
#
# The device machine (no network; nvcc, cmake, ninja and pip's meson, but not
# check, jansson, OpenBLAS, liburing, hwloc or maybe pkg-config):
#   1. here, before the device session:   tools/gpu-debs.sh
#      (downloads the Debian 12 .debs of those, about 14 MiB, into .debs/,
#      which git ignores)
#   2. the device tool's run, with carry [".debs"]:   tools/gpu-check.sh $OUT
#      (unpacks into /tmp/sluice-deps what pkg-config cannot find there)
set -uo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log="$out/gpu-check.log"
: >"$log"
exec > >(tee -a "$log") 2>&1
tee_pid=$!

t_start=$(date +%s)
deadline=$((t_start + ${GPU_CHECK_DEADLINE:-470}))
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
arch=${GPU_ARCH:-90}
bdir=${GPU_CHECK_BUILDDIR:-build-gpu}
status_file="$out/.status.tsv" # stage <tab> status <tab> seconds <tab> detail
: >"$status_file"

say() { printf '\n=== %s (%ss) ===\n' "$*" "$(($(date +%s) - t_start))"; }
left() { echo $((deadline - $(date +%s))); }
# limit WANT RESERVE: WANT seconds, or less so that RESERVE remain for later stages
limit() {
	local l=$(($(left) - $2))
	((l > $1)) && l=$1
	echo $l
}
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$status_file"; }
# run_stage NAME LIMIT CMD...: run with a time limit, record status and time
run_stage() {
	local name=$1 limit=$2
	shift 2
	local t0 rc
	t0=$(date +%s)
	if ((limit < 5)); then
		echo "[$name] skipped: out of time"
		record "$name" skipped 0 "no time left"
		return 124
	fi
	timeout --kill-after=10 "$limit" "$@"
	rc=$?
	local st=ok
	((rc == 124 || rc == 137)) && st=timeout
	((rc != 0 && rc != 124 && rc != 137)) && st="failed($rc)"
	record "$name" "$st" $(($(date +%s) - t0))
	return $rc
}

# ---- the machine ------------------------------------------------------------
say "machine"
uname -a
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not available"
nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x "$nvcc_bin" ]] && export PATH="$(dirname "$nvcc_bin"):$PATH"
nvcc --version 2>&1 | tail -2 || echo "nvcc: not found"
echo "cores: $jobs   git: $(git rev-parse --short HEAD 2>/dev/null || echo none)"

# ---- build dependencies --------------------------------------------------------
# Three sources, tried in this order for what pkg-config cannot find:
#  1. .debs/ (made here by tools/gpu-debs.sh, carried to a machine without
#     network): the .debs of each missing library are unpacked with dpkg -x
#     into $debs_prefix (never into /), their .pc files are pointed there, and
#     PKG_CONFIG_PATH, CPATH, LIBRARY_PATH and LD_LIBRARY_PATH name it.  A
#     shared library that the system already has (ldconfig -p) is taken from
#     the system instead, so that nvcc, gcc and ld keep their own.
#  2. apt-get install, where there is a network.
#  3. nothing: the configure step then says what is missing.
# GPU_CHECK_DEBS=all unpacks every .deb, keeps all their libraries and hides
# the system's .pc files (PKG_CONFIG_LIBDIR): a check of .debs/ itself on a
# machine that has the packages.  GPU_CHECK_DEBS=off ignores .debs/.
say "dependencies"
# this machine's library folder and ldconfig's tag for its libraries
# (x86-64, or AArch64 on a GH200)
ma=$(gcc -print-multiarch 2>/dev/null) || ma="$(uname -m)-linux-gnu"
case $(uname -m) in
aarch64) ld_tag=AArch64 ;;
*) ld_tag=x86-64 ;;
esac
debs_mode=${GPU_CHECK_DEBS:-auto}
debs_prefix=${GPU_CHECK_DEBS_PREFIX:-/tmp/sluice-deps}
# meson and ninja may come from pip: a module, with or without a command on PATH
if ! command -v meson >/dev/null && python3 -c 'import mesonbuild' 2>/dev/null; then
	mkdir -p /tmp/sluice-bin
	printf '#!/bin/sh\nexec "%s" -m mesonbuild.mesonmain "$@"\n' "$(command -v python3)" >/tmp/sluice-bin/meson
	chmod +x /tmp/sluice-bin/meson
	export PATH="/tmp/sluice-bin:$PATH"
fi
if ! command -v ninja >/dev/null; then
	ninja_dir=$(python3 -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null) &&
		[[ -x $ninja_dir/ninja ]] && export PATH="$PATH:$ninja_dir"
fi
echo "meson: $(command -v meson || echo none) $(meson --version 2>/dev/null)   ninja: $(command -v ninja || echo none)"
# the OpenMP build of OpenBLAS, which shares sluice's thread pool (tools/deps.sh)
export PKG_CONFIG_PATH="/usr/lib/$ma/openblas-openmp/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
have_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$1" 2>/dev/null; }
have_omp_blas() { have_pc openblas && pkg-config --variable=openblas_config openblas 2>/dev/null | grep -q 'USE_OPENMP=1'; }
# missing_groups: what pkg-config cannot find, by .pc name
missing_groups() {
	local g=() pc
	command -v pkg-config >/dev/null || g+=(pkg-config)
	for pc in liburing hwloc check jansson; do
		have_pc "$pc" || g+=("$pc")
	done
	have_omp_blas || g+=(openblas)
	echo "${g[*]}"
}
declare -A apt_of=([pkg-config]=pkg-config [liburing]=liburing-dev
	[hwloc]=libhwloc-dev [check]="check libsubunit-dev" [jansson]=libjansson-dev
	[openblas]=libopenblas-openmp-dev)
# >>> debs (tools/gpu-debs.sh downloads these; keep the two lists in step)
declare -A debs_of=([pkg-config]="pkgconf-bin libpkgconf3" [liburing]="liburing-dev liburing2"
	[hwloc]="libhwloc-dev libhwloc15 libudev1"
	[check]="check libsubunit-dev libsubunit0" [jansson]="libjansson-dev libjansson4"
	[openblas]="libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0")
# unpack_deb DEB DIR: dpkg -x, or ar and tar where dpkg is missing
unpack_deb() {
	if command -v dpkg-deb >/dev/null; then
		dpkg-deb -x "$1" "$2"
		return
	fi
	local m z
	m=$(ar t "$1" | grep '^data\.tar') || return 1
	case $m in
	*.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *.bz2) z=-j ;; *) z= ;;
	esac
	ar p "$1" "$m" | tar -x $z -C "$2" -f -
}
# use_debs GROUP...: unpack the .debs of these groups into $debs_prefix and
# point pkg-config, the compiler, the linker and the loader at them
use_debs() {
	local lib=$debs_prefix/usr/lib/$ma names=() n f g real sys d cache
	for g; do
		# shellcheck disable=SC2206 # a list of names
		names+=(${debs_of[$g]})
	done
	rm -rf "$debs_prefix"
	mkdir -p "$debs_prefix"
	for n in "${names[@]}"; do
		f=$(compgen -G ".debs/${n}_*.deb" | head -1)
		if [[ -z $f ]]; then
			echo "  .debs/ has no $n"
			continue
		fi
		unpack_deb "$f" "$debs_prefix" && echo "  unpacked ${f#.debs/}" || echo "  could not unpack $f"
	done
	# a runtime library the system has: use the system's (same soname, the
	# same or a newer version on a newer distribution)
	if [[ $debs_mode != all ]]; then
		cache=$({ command -v ldconfig >/dev/null && ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null)
		local soname_re='^lib.*\.so\.[0-9]+$'
		for f in "$lib"/lib*.so.*; do
			n=${f##*/}
			[[ -L $f && $n =~ $soname_re ]] || continue
			sys=$(awk -v n="$n" -v t="$ld_tag" '$1 == n && index($0, t) { print $NF; exit }' <<<"$cache")
			[[ -n $sys && -e $sys && $sys != "$debs_prefix"/* ]] || continue
			real=$(readlink "$f")
			rm -f "$f" "$lib/$real"
			for d in "$lib"/*.so; do
				[[ -L $d ]] || continue
				g=$(readlink "$d")
				[[ $g == "$real" || $g == "$n" ]] && ln -sfn "$sys" "$d"
			done
			echo "  $n: the system's $sys"
		done
	fi
	# the .pc files say /usr
	find "$debs_prefix" -name '*.pc' -exec \
		sed -i -E "s#^([A-Za-z_][A-Za-z0-9_]*)=/usr(/|\$)#\\1=$debs_prefix/usr\\2#" {} +
	local pcs="$lib/openblas-openmp/pkgconfig:$lib/pkgconfig:$debs_prefix/usr/share/pkgconfig"
	if [[ $debs_mode == all ]]; then
		export PKG_CONFIG_LIBDIR=$pcs
		unset PKG_CONFIG_PATH
	else
		export PKG_CONFIG_PATH="$pcs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	fi
	export CPATH="$debs_prefix/usr/include:$debs_prefix/usr/include/$ma:$debs_prefix/usr/include/$ma/openblas-openmp${CPATH:+:$CPATH}"
	export LIBRARY_PATH="$lib/openblas-openmp:$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
	export LD_LIBRARY_PATH="$lib/openblas-openmp:$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	# pkg-config itself, where the system has none (or GPU_CHECK_DEBS=all)
	if [[ -x $debs_prefix/usr/bin/pkgconf ]] && { [[ $debs_mode == all ]] || ! command -v pkg-config >/dev/null; }; then
		mkdir -p "$debs_prefix/bin"
		printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
			"$lib" "$debs_prefix/usr/bin/pkgconf" >"$debs_prefix/bin/pkg-config"
		chmod +x "$debs_prefix/bin/pkg-config"
		export PATH="$debs_prefix/bin:$PATH"
		export PKG_CONFIG="$debs_prefix/bin/pkg-config"
	fi
}
# <<< debs
groups=$(missing_groups)
[[ $debs_mode == all ]] && groups="${!debs_of[*]}"
if [[ -n $groups && $debs_mode != off ]] && compgen -G '.debs/*.deb' >/dev/null; then
	echo "from .debs/ into $debs_prefix: $groups"
	t0=$(date +%s)
	# shellcheck disable=SC2086
	use_debs $groups
	groups=$(missing_groups)
	record debs "$([[ -z $groups ]] && echo ok || echo partial)" $(($(date +%s) - t0)) "${groups:+still missing: $groups}"
	echo "PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-}  PKG_CONFIG_LIBDIR=${PKG_CONFIG_LIBDIR:-}"
	echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi
missing=()
command -v meson >/dev/null || missing+=(meson)
command -v ninja >/dev/null || missing+=(ninja-build)
for g in $groups; do
	# shellcheck disable=SC2206 # a list of names
	missing+=(${apt_of[$g]})
done
if ((${#missing[@]})); then
	echo "missing: ${missing[*]}"
	if command -v apt-get >/dev/null; then
		export DEBIAN_FRONTEND=noninteractive
		sudo_cmd=""
		[[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo_cmd=sudo
		run_stage apt-get 180 bash -c "$sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq ${missing[*]}" ||
			echo "WARNING: could not install ${missing[*]} (no network?); the configure step will say what is missing"
	else
		echo "WARNING: no apt-get; install ${missing[*]} by hand"
	fi
else
	echo "all present"
	record apt-get ok 0 "nothing missing"
fi

# ---- configure and build ---------------------------------------------------------
say "configure"
arch_opt=gpu_arch
grep -q "option('cuda_arch'" meson_options.txt 2>/dev/null && arch_opt=cuda_arch
built=0
if [[ -f $bdir/build.ninja ]]; then
	run_stage configure 120 meson configure "$bdir" -Dcuda=enabled -D$arch_opt="$arch" -Dbuildtype=release
else
	run_stage configure 120 meson setup "$bdir" -Dcuda=enabled -D$arch_opt="$arch" -Dbuildtype=release
fi
if [[ $? -eq 0 ]]; then
	say "build"
	run_stage build "$(limit 300 150)" ninja -C "$bdir" -j "$jobs" && built=1
fi

# ---- tests ----------------------------------------------------------------------
tests_ok=0
if ((built)); then
	say "tests"
	run_stage meson_test "$(limit 240 60)" \
		meson test -C "$bdir" --print-errorlogs --num-processes 4 --no-suite emu && tests_ok=1
	[[ -f $bdir/meson-logs/testlog.json ]] && cp "$bdir/meson-logs/testlog.json" "$out/testlog.json"
	# every test's own output (the cross-backend op table among them)
	[[ -f $bdir/meson-logs/testlog.txt ]] && cat "$bdir/meson-logs/testlog.txt"
fi

# ---- benchmarks --------------------------------------------------------------------
# ===== BENCHMARKS: add or change rows here. ======================================
# Each row: a name and a command whose stdout is JSON (or text); a failing or
# slow one is recorded and the table goes on.
# the cost model on the GPU (issue 13): a profile, then `sluice policy` at a
# 16 GB device for OPT-6.7B and OPT-30B, its choice run beside FlexGen's
# published policy for the same model; each bench prints the prediction
# beside the measurement (predicted_throughput_tok_s, throughput_tok_s)
prof="$out/profile.json"
pol="$bdir/sluice policy --backend cuda --prompt-len 512 --gen-len 32 --gpu-mem 16G --cpu-mem 100G --profile $prof"
pbench="$bdir/sluice bench --backend cuda --prompt-len 512 --gen-len 32 --gpu-mem 16G --cpu-mem 100G --profile $prof --json"
benches=(
	"gemm_bench|$bdir/gemm_bench --json --quick"
	"profile|$bdir/sluice profile --backend cuda --json $prof >/dev/null && cat $prof"
	"opt-6.7b_16G_policy|$pol --dummy opt-6.7b --out $out/policy-6.7b.json --json"
	"opt-6.7b_16G_chosen|$pbench --dummy opt-6.7b --policy $out/policy-6.7b.json"
	"opt-6.7b_16G_flexgen|$pbench --dummy opt-6.7b --percent 100 0 100 0 100 0 --gpu-batch-size 2 --no-overlap"
	"opt-30b_16G_policy|$pol --dummy opt-30b --out $out/policy-30b.json --json"
	"opt-30b_16G_chosen|$pbench --dummy opt-30b --policy $out/policy-30b.json"
	"opt-30b_16G_flexgen|$pbench --dummy opt-30b --percent 20 80 0 100 0 100 --gpu-batch-size 48 --num-gpu-batches 3 --cpu-cache-compute"
	"opt-6.7b_16G_p512_g512_h2o_policy|$bdir/sluice policy --backend cuda --prompt-len 512 --gen-len 512 --gpu-mem 16G --cpu-mem 100G --profile $prof --dummy opt-6.7b --min-kv-budget 0.2 --out $out/policy-6.7b-h2o.json --json"
	"opt-6.7b_p512_g32_b8|$bdir/sluice bench --backend cuda --dummy opt-6.7b --prompt-len 512 --gen-len 32 --batch 8 --json"
	"opt-1.3b_p512_g32_b32|$bdir/sluice bench --backend cuda --dummy opt-1.3b --prompt-len 512 --gen-len 32 --batch 32 --json"
	# the H2O issue: a 16 GB device (the papers' T4), the cache in pinned host
	# memory, the largest batch each cache lets fit, dense against H2O 20%
	"opt-6.7b_16G_dense|$bdir/sluice bench --backend cuda --dummy opt-6.7b --prompt-len 512 --gen-len 32 --batch max --gpu-batch-size 32 --percent 100 0 0 100 100 0 --gpu-mem 16G --cpu-mem 24G --json"
	"opt-6.7b_16G_h2o20|$bdir/sluice bench --backend cuda --dummy opt-6.7b --prompt-len 512 --gen-len 32 --batch max --gpu-batch-size 32 --percent 100 0 0 100 100 0 --gpu-mem 16G --cpu-mem 24G --hh-ratio 0.1 --json"
	"opt-30b_16G_dense|$bdir/sluice bench --backend cuda --dummy opt-30b --prompt-len 512 --gen-len 32 --batch max --gpu-batch-size 32 --percent 20 80 0 100 0 100 --gpu-mem 16G --cpu-mem 90G --json"
	"opt-30b_16G_h2o20|$bdir/sluice bench --backend cuda --dummy opt-30b --prompt-len 512 --gen-len 32 --batch max --gpu-batch-size 32 --percent 20 80 0 100 0 100 --gpu-mem 16G --cpu-mem 90G --hh-ratio 0.1 --json"
)
# ===================================================================================
mkdir -p "$out/.bench"
if ((built)); then
	say "benchmarks"
	i=0
	for row in "${benches[@]}"; do
		name=${row%%|*}
		cmd=${row#*|}
		exe=${cmd%% *}
		i=$((i + 1))
		# a program defined in bench/meson.build lands in $bdir/bench/
		alt="$bdir/bench/${exe##*/}"
		if [[ ! -x $exe && -x $alt ]]; then
			cmd="$alt${cmd#"$exe"}"
			exe=$alt
		fi
		if [[ ! -x $exe ]]; then
			echo "[$name] skipped: $exe not built"
			record "bench:$name" missing 0 "$exe not built"
			continue
		fi
		lim=$(limit 150 15)
		echo "[$name] $cmd"
		run_stage "bench:$name" "$lim" bash -c "$cmd" >"$out/.bench/$i.out" 2>"$out/.bench/$i.err"
		cat "$out/.bench/$i.out"
		tail -5 "$out/.bench/$i.err"
		printf '%s\n' "$name" >"$out/.bench/$i.name"
	done
fi

# ---- results.json and the summary ------------------------------------------------------
elapsed=$(($(date +%s) - t_start))
python3 - "$out" "$status_file" "$elapsed" "$built" "$tests_ok" <<'PY' || echo "(python3 missing: no results.json)"
import json, os, subprocess, sys
out, status_file, elapsed, built, tests_ok = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1"

def cmd(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:
        return "unavailable (%s)" % e

stages = []
for line in open(status_file):
    p = line.rstrip("\n").split("\t")
    if len(p) >= 3:
        stages.append({"stage": p[0], "status": p[1], "seconds": int(p[2]), "detail": p[3] if len(p) > 3 else ""})

tests = {"ok": 0, "fail": 0, "skip": 0, "timeout": 0, "other": 0, "list": []}
tl = os.path.join(out, "testlog.json")
if os.path.exists(tl):
    for line in open(tl):
        try:
            t = json.loads(line)
        except ValueError:
            continue
        r = str(t.get("result", "")).lower()
        key = {"ok": "ok", "fail": "fail", "skip": "skip", "timeout": "timeout"}.get(r, "other")
        tests[key] += 1
        tests["list"].append({"name": t.get("name"), "result": r, "seconds": round(t.get("duration", 0), 2)})

benches = []
bd = os.path.join(out, ".bench")
if os.path.isdir(bd):
    for f in sorted(x for x in os.listdir(bd) if x.endswith(".name")):
        i = f[:-5]
        name = open(os.path.join(bd, f)).read().strip()
        text = open(os.path.join(bd, i + ".out")).read() if os.path.exists(os.path.join(bd, i + ".out")) else ""
        st = next((s["status"] for s in stages if s["stage"] == "bench:" + name), "?")
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        benches.append({"name": name, "status": st, "json": data, "text": None if data is not None else text[-4000:]})

res = {
    "gpu": cmd("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"),
    "nvcc": cmd("nvcc", "--version").splitlines()[-1:] ,
    "git": cmd("git", "rev-parse", "HEAD"),
    "built": built, "tests_ok": tests_ok, "elapsed_s": elapsed,
    "stages": stages, "tests": tests, "benchmarks": benches,
}
json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=1)

print("\n=== summary (%ds) ===" % elapsed)
print("%-34s %-12s %6s" % ("stage", "status", "sec"))
for s in stages:
    print("%-34s %-12s %6d" % (s["stage"][:34], s["status"], s["seconds"]))
print("tests: %d ok, %d failed, %d skipped, %d timed out" % (tests["ok"], tests["fail"], tests["skip"], tests["timeout"]))
for t in tests["list"]:
    if t["result"] not in ("ok", "skip"):
        print("  FAILED: %s (%s)" % (t["name"], t["result"]))
for b in benches:
    j = b["json"]
    brief = ""
    if isinstance(j, dict):
        keys = [k for k in j if any(w in k.lower() for w in ("tok", "tflop", "gbps", "gb_s", "throughput", "seconds"))]
        brief = ", ".join("%s=%s" % (k, j[k]) for k in keys[:4])
    print("bench %-28s %-12s %s" % (b["name"][:28], b["status"], brief[:80]))
print("results: %s/results.json  log: %s/gpu-check.log" % (out, out))
PY
rm -rf "$out/.bench" "$status_file"
rc=1
((built && tests_ok)) && rc=0
exec >&- 2>&-
wait "$tee_pid" 2>/dev/null
exit $rc
