#!/usr/bin/env bash
# What zstd-compressed disk segments would buy (issue #14): the weight
# stores `sluice convert` writes for every decoder layer on disk
# (--percent 0 0 100 0 100 0), of a dummy model (random weights) and of the
# bundled trained model (models/opt-tiny-kjv), measured by
# build/zstd_bench: compression ratio as stored and byte-shuffled, the
# compression rate, and the decompression (+ unshuffle) rate on 1 to all
# cores by the wall clock and per core by CPU time (a shared VM's wall
# clock says more about its neighbours), beside the offload folder's
# O_DIRECT read rate.  Then the rule:
# reading a segment of S bytes takes S / D plain; compressed (ratio r), its
# frames read at D and decompressed by c I/O threads at d GB/s each, the
# two overlapped, it takes S / min(r D, c d): it pays when c d > D (and
# r > 1), and gains at most a factor r.
#
# Environment (defaults): DUMMY=opt-125m LEVELS=1,3,9 REPS=3
#   DIR=/tmp/sluice-zstd-bench SLUICE=build/sluice BENCH=build/zstd_bench
# Writes bench/results/zstd-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
DUMMY=${DUMMY:-opt-125m}
LEVELS=${LEVELS:-1,3,9}
REPS=${REPS:-3}
DIR=${DIR:-/tmp/sluice-zstd-bench}
SLUICE=${SLUICE:-build/sluice}
BENCH=${BENCH:-build/zstd_bench}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/zstd-$stamp
mkdir -p "$DIR" bench/results
threads=$(seq -s, 1 "$(nproc)")
: >"$out.jsonl"
cmds=()
run_one() { # label, layers, convert args...
	local label=$1 layers=$2
	shift 2
	"$SLUICE" convert "$@" --offload-dir "$DIR" --percent 0 0 100 0 100 0 >&2
	local store
	store=$("$SLUICE" convert --offload-dir "$DIR" --list | awk -v m="$label" '$1 == "current" && index($4, m ".") == 1 {print $4}')
	local cmd=(env OMP_WAIT_POLICY=passive "$BENCH" "$DIR/$store" --layers "$layers" --levels "$LEVELS" --threads "$threads" --reps "$REPS")
	[ ${#cmds[@]} -eq 0 ] && cmd+=(--probe "$DIR")
	cmds+=("${cmd[*]}")
	echo "+ ${cmd[*]}" >&2
	"${cmd[@]}" | python3 -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l); d["model"] = sys.argv[1]; print(json.dumps(d))' "$label" >>"$out.jsonl"
}
layers() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$1"; }
case $DUMMY in opt-125m) dl=12 ;; opt-350m) dl=24 ;; opt-1.3b) dl=24 ;; *) echo "DUMMY: opt-125m, opt-350m or opt-1.3b" >&2; exit 2 ;; esac
run_one "$DUMMY" "$dl" --dummy "$DUMMY"
run_one opt-tiny-kjv "$(layers models/opt-tiny-kjv/config.json)" --model models/opt-tiny-kjv
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" \
	"$(df -h "$DIR" | awk 'NR==2 {print $1 " (" $2 ")"}')" "$(cut -d' ' -f1-3 /proc/loadavg)" \
	"$(printf '%s\n' "${cmds[@]}")" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
disk = next(r["disk_read_gbps"] for r in rows if "disk_read_gbps" in r)
mode = next(r["disk_mode"] for r in rows if "disk_mode" in r)
cores = rows[0]["cores"]
def rate(r, t):
    return next(x["gbps"] for x in r["decompress"] if x["threads"] == t)
def eff(ratio, D, cd):  # GB/s of uncompressed weights out of the disk tier
    return min(ratio * D, cd)
with open(sys.argv[2], "w") as f:
    f.write("# zstd-compressed disk segments: ratio and decompression rate\n\n")
    f.write(f"- machine: {sys.argv[3]}, {sys.argv[4]} cores (shared VM; load average "
            f"{sys.argv[6]} as the run ended); offload folder on {sys.argv[5]}\n")
    f.write(f"- disk: O_DIRECT sequential read {disk:.2f} GB/s ({mode}, 1 GiB, sl_disk_probe_read)\n")
    f.write("- data: the weight stores of `sluice convert --percent 0 0 100 0 100 0` "
            "(every decoder layer on disk), one zstd frame per 4 MiB window of a layer's segment; "
            "shuffled = each window's low bytes, then its high bytes\n")
    f.write("- rates in GB/s (1e9 bytes/s) of uncompressed bytes; decompression includes the unshuffle; "
            "best of the passes\n- commands:\n")
    for c in sys.argv[7].splitlines():
        f.write(f"  - `{c}`\n")
    f.write("\n| model | level | ratio as stored | ratio shuffled | compress 1 thread | "
            + " | ".join(f"decompress {t} thr (wall)" for t in range(1, cores + 1))
            + " | decompress per core (CPU time) | unshuffle alone, 1 thr |\n")
    f.write("|---|---|---|---|---|" + "---|" * cores + "---|---|\n")
    for r in rows:
        f.write(f"| {r['model']} | {r['level']} | {r['ratio_plain']:.3f} | {r['ratio_shuffled']:.3f} | "
                f"{r['compress_gbps_1t']:.3f} | "
                + " | ".join(f"{rate(r, t):.3f}" for t in range(1, cores + 1))
                + f" | {r['decompress'][0]['gbps_per_cpu_s']:.3f}"
                + f" | {r['decompress'][0]['unshuffle_gbps']:.2f} |\n")
    f.write("\n## When it pays\n\n")
    f.write("A segment of S bytes reads in S / D plain; compressed by r and decompressed by c "
            "I/O threads at d GB/s each, overlapped with the reads, in S / min(r D, c d). "
            "It pays when c d > D, and gains at most the factor r. d is the one-thread pass's "
            "rate by CPU time (what a core does when it is not shared; the wall-clock rates "
            "above are this shared VM's, under the load given).\n\n")
    f.write(f"| model | level | r | d | here ({cores} cores): D; plain, zstd GB/s | "
            "16 cores, 3 GB/s disk: plain, zstd GB/s | cores for the full gain at 3 GB/s (r D / d) |\n")
    f.write("|---|---|---|---|---|---|---|\n")
    for r in rows:
        d1 = r["decompress"][0]["gbps_per_cpu_s"]
        ratio = r["ratio_shuffled"]
        f.write(f"| {r['model']} | {r['level']} | {ratio:.3f} | {d1:.3f} | "
                f"{disk:.2f}; {disk:.2f}, {eff(ratio, disk, cores * d1):.2f} | "
                f"3.00, {eff(ratio, 3.0, 16 * d1):.2f} | {ratio * 3.0 / d1:.1f} |\n")
    f.write("\nThe 16-core column takes c d = 16 d: frames decompress independently, so the "
            "rate scales with cores while memory bandwidth lasts. Cores spent decompressing "
            "are taken from CPU compute, which a GPU run leaves mostly idle; on the CPU backend "
            "they are the GEMM's.\n")
PY
echo "wrote $out.md" >&2
