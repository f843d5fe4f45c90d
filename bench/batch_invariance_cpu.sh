#!/usr/bin/env bash
# What batch invariance costs on the CPU backend, side by side in one run:
# sluice's own GEMM (the default: one summation order whatever the rows, so
# a sequence's tokens do not depend on the batch) against OpenBLAS's sgemm
# (--cpu-gemm openblas: kernel and blocking chosen by the row count).
#
#  1. the GEMMs alone (build/cpu_gemm_bench) at OPT prefill shapes, rows
#     GEMM_ROWS, for each OpenBLAS core in GEMM_CORES ("auto": OPENBLAS_CORETYPE
#     and OPENBLAS_L2_SIZE unset, so OpenBLAS detects the CPU; else
#     OPENBLAS_CORETYPE=NAME), once per thread count in GEMM_THREADS (0: all
#     cores); each process times sluice, one sgemm call and sgemm on fixed
#     tiles of 128 rows (the cheapest way to make OpenBLAS batch invariant),
#     interleaved, GEMM_REPS times; GEMM_ROUNDS processes per cell.
#  2. `sluice bench` end to end, prompt P, gen G, at BATCHES for MODELS:
#     "sluice" (the default), and "openblas:NAME" for NAME in E2E_CORES
#     (--cpu-gemm openblas, OPENBLAS_CORETYPE=NAME), REPEAT times, interleaved.
# Every run records the load average before it (the machine is shared).
# The table gives medians and ratios of medians.
#
# Environment (defaults): SLUICE=build/sluice GEMM_BENCH=build/cpu_gemm_bench
#   GEMM_CORES="auto Haswell SkylakeX Cooperlake" GEMM_THREADS="0 1"
#   GEMM_ROWS=128,512,2048,4096 GEMM_ROWS_1=512,2048 (rows at 1 thread)
#   GEMM_REPS=3 GEMM_ROUNDS=2 MODELS="opt-125m opt-1.3b" BATCHES="1 8 32" P=128
#   G=32 REPEAT=3 E2E_CORES="SkylakeX Cooperlake" OUTDIR=bench/results
#   PARTS="gemm e2e"
#   SUMMARIZE=FILE.jsonl: run nothing, only remake FILE.md from the runs in
#                         FILE (a run that was stopped, or a changed table)
# Writes OUTDIR/batch-invariance-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE=${SLUICE:-build/sluice}
GEMM_BENCH=${GEMM_BENCH:-build/cpu_gemm_bench}
GEMM_CORES=${GEMM_CORES:-"auto Haswell SkylakeX Cooperlake"}
GEMM_THREADS=${GEMM_THREADS:-"0 1"}
GEMM_ROWS=${GEMM_ROWS:-128,512,2048,4096}
GEMM_ROWS_1=${GEMM_ROWS_1:-512,2048}
GEMM_REPS=${GEMM_REPS:-3}
GEMM_ROUNDS=${GEMM_ROUNDS:-2}
MODELS=${MODELS:-"opt-125m opt-1.3b"}
BATCHES=${BATCHES:-"1 8 32"}
P=${P:-128}
G=${G:-32}
REPEAT=${REPEAT:-3}
E2E_CORES=${E2E_CORES:-"SkylakeX Cooperlake"}
OUTDIR=${OUTDIR:-bench/results}
PARTS=${PARTS:-"gemm e2e"}
if [[ -n ${SUMMARIZE:-} ]]; then
	[[ -f $SUMMARIZE && $SUMMARIZE == *.jsonl ]] || { echo "SUMMARIZE=$SUMMARIZE: not a .jsonl file here" >&2; exit 2; }
	out=${SUMMARIZE%.jsonl}
	PARTS=""
else
	stamp=$(date -u +%Y%m%d-%H%M%S)
	out=$OUTDIR/batch-invariance-$stamp
	mkdir -p "$OUTDIR"
	: >"$out.jsonl"
fi

# core_env NAME: the env(1) words for an OpenBLAS core, one per line
core_env() {
	if [[ $1 == auto ]]; then
		printf '%s\n' env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
	else
		printf '%s\n' env -u OPENBLAS_L2_SIZE "OPENBLAS_CORETYPE=$1"
	fi
}
# record PART SYSTEM REPEAT CMD...: run CMD (one JSON object on stdout) and
# append it with the command, the system, the repeat and the load average
record() {
	local part=$1 sys=$2 rep=$3 load
	shift 3
	load=$(cut -d' ' -f1 /proc/loadavg)
	echo "+ [load $load] $*" >&2
	"$@" | python3 -c 'import json, sys
d = json.loads(sys.stdin.read())
d.update(part=sys.argv[1], system=sys.argv[2], repeat=int(sys.argv[3]), load1=float(sys.argv[4]),
         cmd=sys.argv[5])
print(json.dumps(d))' "$part" "$sys" "$rep" "$load" "$*" >>"$out.jsonl"
}

if [[ " $PARTS " == *" gemm "* ]]; then
	for rep in $(seq "$GEMM_ROUNDS"); do
		for t in $GEMM_THREADS; do
			rows=$GEMM_ROWS
			[[ $t == 1 ]] && rows=$GEMM_ROWS_1
			for c in $GEMM_CORES; do
				# the detected core is slow here: one round, the smaller rows
				[[ $c == auto && $rep -gt 1 ]] && continue
				r=$rows
				[[ $c == auto ]] && r=$GEMM_ROWS_1
				mapfile -t pre < <(core_env "$c")
				record gemm "$c" "$rep" "${pre[@]}" "$GEMM_BENCH" --json --threads "$t" \
					--reps "$GEMM_REPS" --rows "$r"
			done
		done
	done
fi
if [[ " $PARTS " == *" e2e "* ]]; then
	systems=(sluice)
	for c in $E2E_CORES; do systems+=("openblas:$c"); done
	for rep in $(seq "$REPEAT"); do
		for model in $MODELS; do
			for b in $BATCHES; do
				for sys in "${systems[@]}"; do
					if [[ $sys == sluice ]]; then
						pre=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
						gemm=()
					else
						mapfile -t pre < <(core_env "${sys#openblas:}")
						gemm=(--cpu-gemm openblas)
					fi
					record e2e "$sys" "$rep" "${pre[@]}" "$SLUICE" bench --backend cpu --dummy "$model" \
						--prompt-len "$P" --gen-len "$G" --batch "$b" "${gemm[@]}" --json
				done
			done
		done
	done
fi

python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" \
	"$(lscpu | sed -n 's/^Flags: *//p' | tr ' ' '\n' | grep -E '^avx(2|512f)$' | tr '\n' ' ')" \
	"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = statistics.median
L = ["# Batch-invariant CPU GEMM: the cost, side by side", ""]
loads = [r["load1"] for r in runs]
L.append(f"- machine: {sys.argv[3]}, {sys.argv[4]} cores (a shared VM), CPU flags {sys.argv[5]}; "
         f"commit {sys.argv[6]}")
if loads:
    L.append(f"- load average (1 min) before each run: median {med(loads):.2f}, "
             f"min {min(loads):.2f}, max {max(loads):.2f}")
L.append("")
gemm = [r for r in runs if r["part"] == "gemm"]
if gemm:
    r0 = gemm[0]
    L += ["## 1. The GEMMs alone (GFLOP/s, median of every timing)", "",
          "`sluice`: the gemm op (fp16 weights widened inside, bias epilogue), batch invariant; "
          "`blas`: one cblas_sgemm with fp32 weights (no widening, no epilogue: OpenBLAS's "
          "ceiling); `blas-tiled`: sgemm on fixed tiles of 128 rows, the tail padded (a fixed "
          "shape per call). sluice's kernels: " + str(r0["cpu_kernels"]) + f"; {r0['reps']} timings per "
          "process, interleaved; the sluice column pools the processes of every core.", "",
          "- OpenBLAS cores: " + "; ".join(sorted({f"{r['system']} -> {r['blas_core']}" for r in gemm})),
          "- command: `" + r0["cmd"] + "`", ""]
    for th in sorted({r["threads"] for r in gemm}, reverse=True):
        g = [r for r in gemm if r["threads"] == th]
        cores = list(dict.fromkeys(r["system"] for r in g))
        cells = {}
        for r in g:
            for row in r["rows"]:
                key = (row["model"], row["m"], row["n"], row["k"])
                c = cells.setdefault(key, {"sluice": []})
                c["sluice"] += row["sluice_runs"]
                c.setdefault(r["system"], {"blas": [], "tiled": []})
                c[r["system"]]["blas"] += row["blas_runs"]
                c[r["system"]]["tiled"] += row["blas_tiled_runs"]
        L.append(f"### {th} thread{'s' if th > 1 else ''}")
        L.append("")
        hdr = "| model | m | n | k | sluice | " + " | ".join(f"blas {c} | tiled {c}" for c in cores) + \
              " | sluice / best blas |"
        L += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
        ratios = []
        for key, c in cells.items():
            s = med(c["sluice"])
            best = max(med(c[x]["blas"]) for x in cores if x in c)
            ratios.append(s / best)
            L.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {s:.1f} | " +
                     " | ".join(f"{med(c[x]['blas']):.1f} | {med(c[x]['tiled']):.1f}" if x in c else " | "
                                for x in cores) + f" | {s / best:.2f} |")
        L += ["", f"sluice / best OpenBLAS core, over the shapes: median {med(ratios):.2f}, "
              f"min {min(ratios):.2f}, max {max(ratios):.2f}", ""]
e2e = [r for r in runs if r["part"] == "e2e"]
if e2e:
    r0 = e2e[0]
    L += ["## 2. End to end: `sluice bench`", "",
          f"Dummy weights, prompt {r0['prompt_len']}, {r0['gen_len']} new tokens, {r0['threads']} threads, "
          f"CPU backend; {max(r['repeat'] for r in e2e)} runs per cell, interleaved; medians. "
          "`sluice`: the default GEMM (batch invariant); `openblas:X`: `--cpu-gemm openblas` with "
          "OPENBLAS_CORETYPE=X (the GEMMs above 8 rows: the prefill, and decode at batch 32).", "",
          "- GEMMs that ran: " + "; ".join(sorted({f"{r['system']} -> {r['cpu_kernels']}, "
                                                  f"{r['cpu_gemm']} {r['blas_core'] or ''}".strip()
                                                  for r in e2e})),
          "- command: `" + r0["cmd"] + "`", "",
          "| model | batch | system | tok/s | prefill s | decode s | prefill GEMM GFLOP/s | "
          "tok/s sluice / this | prefill this / sluice |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    cells = {}
    for r in e2e:
        cells.setdefault((r["model_name"], r["batch"], r["system"]), []).append(r)
    systems = list(dict.fromkeys(r["system"] for r in e2e))
    for model in dict.fromkeys(r["model_name"] for r in e2e):
        for b in sorted({r["batch"] for r in e2e if r["model_name"] == model}):
            base = cells.get((model, b, "sluice"))
            for s in systems:
                rs = cells.get((model, b, s))
                if not rs:
                    continue
                t = med(x["throughput_tok_s"] for x in rs)
                pf = med(x["prefill_s"] for x in rs)
                ratio = " | "
                if base and s != "sluice":
                    ratio = (f"{med(x['throughput_tok_s'] for x in base) / t:.2f} | "
                             f"{pf / med(x['prefill_s'] for x in base):.2f}")
                L.append(f"| {model} | {b} | {s} | {t:.2f} | {pf:.2f} | "
                         f"{med(x['decode_s'] for x in rs):.2f} | "
                         f"{med(x['gemm_gflops'] for x in rs):.1f} | {ratio} |")
    L += ["", "tok/s sluice / this: above 1, the default (invariant) GEMM is faster; "
          "prefill this / sluice: above 1, the default's prefill is shorter.", ""]
open(sys.argv[2], "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
echo "wrote $out.jsonl and $out.md" >&2
