#!/usr/bin/env bash
# The CPU GEMM with 4-bit weights (issue 14) against fp16 weights, side by
# side in one process (build/cpu_gemm_bench --q4: the two gemm ops on the
# same weights, interleaved, REPS timings each) at OPT-125m and OPT-1.3b's
# layer shapes (qkv/out, fc1, fc2), rows ROWS; ROUNDS processes.  Every run
# records the load average before it (the machine is shared).  The table
# gives the median GFLOP/s of every timing, the ratio q4 / fp16, and the
# weight bytes each op streams per second (fp16: 2 n k; 4-bit: 36 / 64
# bytes per weight), the figure that matters at decode-sized m.
#
# Environment (defaults): GEMM_BENCH=build/cpu_gemm_bench ROWS=1,8,64,256
#   MODELS=opt-125m,opt-1.3b REPS=7 ROUNDS=3 THREADS=0 OUTDIR=bench/results
# Writes OUTDIR/q4-gemm-cpu-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
GEMM_BENCH=${GEMM_BENCH:-build/cpu_gemm_bench}
ROWS=${ROWS:-1,8,64,256}
MODELS=${MODELS:-opt-125m,opt-1.3b}
REPS=${REPS:-7}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-0}
OUTDIR=${OUTDIR:-bench/results}
[[ -x $GEMM_BENCH ]] || { echo "q4_gemm_cpu.sh: $GEMM_BENCH: not built (ninja -C build)" >&2; exit 2; }
stamp=$(date -u +%Y%m%d-%H%M%S)
out=$OUTDIR/q4-gemm-cpu-$stamp
mkdir -p "$OUTDIR"
: >"$out.jsonl"
cmd=("$GEMM_BENCH" --json --q4 --no-blas --threads "$THREADS" --reps "$REPS" --rows "$ROWS"
	--models "$MODELS")
for ((round = 0; round < ROUNDS; round++)); do
	load=$(cut -d' ' -f1 /proc/loadavg)
	echo "+ [load $load] ${cmd[*]}" >&2
	"${cmd[@]}" | python3 -c 'import json, sys
d = json.loads(sys.stdin.read())
d.update(round=int(sys.argv[1]), load1=float(sys.argv[2]), cmd=sys.argv[3])
print(json.dumps(d))' "$round" "$load" "${cmd[*]}" >>"$out.jsonl"
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$out.jsonl" "$commit" "$cpu" "$(nproc)" >"$out.md" <<'PY'
import json, statistics, sys
path, commit, cpu, ncpu = sys.argv[1:5]
runs = [json.loads(l) for l in open(path)]
cells = {}
for r in runs:
    for row in r["rows"]:
        key = (row["model"], row["m"], row["n"], row["k"])
        c = cells.setdefault(key, {"fp16": [], "q4": []})
        c["fp16"] += row["sluice_runs"]
        c["q4"] += row["q4_runs"]
loads = [r["load1"] for r in runs]
print("# CPU GEMM: 4-bit weights (dequantised inside) against fp16 weights\n")
print(f"- machine: {cpu}, {ncpu} cores (a shared VM); kernels {runs[0]['cpu_kernels']}, "
      f"{runs[0]['threads']} threads; commit {commit}")
print(f"- command: `{runs[0]['cmd']}`, {len(runs)} processes")
print(f"- load average (1 min) before each process: {', '.join(f'{l:.2f}' for l in loads)}")
print("- GFLOP/s: median of every timing (2 m n k per product); weight GB/s: the bytes of the "
      "weights the op reads (fp16 2 n k, 4-bit 0.5625 n k) over the median time\n")
print("| model | m | n | k | fp16 GFLOP/s | 4-bit GFLOP/s | 4-bit / fp16 | fp16 weight GB/s | 4-bit weight GB/s |")
print("|---|---|---|---|---|---|---|---|---|")
for (model, m, n, k), c in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
    f = statistics.median(c["fp16"])
    q = statistics.median(c["q4"])
    flop = 2.0 * m * n * k
    tf, tq = flop / (f * 1e9), flop / (q * 1e9)
    print(f"| {model} | {m} | {n} | {k} | {f:.1f} | {q:.1f} | {q / f:.2f} | "
          f"{2.0 * n * k / tf / 1e9:.1f} | {0.5625 * n * k / tq / 1e9:.1f} |")
PY
echo "wrote $out.md" >&2
