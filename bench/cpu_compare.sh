#!/usr/bin/env bash
# Side-by-side throughput: sluice vs Hugging Face transformers on the CPU.
#
# For every (model, batch) of the grid it runs, REPEAT times, first sluice
#   $SLUICE bench --dummy MODEL --prompt-len P --gen-len G --batch B --json
# then the HF baseline
#   $PYTHON bench/hf_cpu_bench.py --model MODEL --prompt-len P --gen-len G \
#       --batch B --threads HF_THREADS --dtype HF_DTYPE --json
# Each prints one JSON object on stdout (sluice: at least throughput_tok_s,
# prefill_s, decode_s, gemm_gflops). Results go to
#   $OUTDIR/cpu-<UTC date-time>.jsonl   every run + machine + per-cell summary
#   $OUTDIR/cpu-<UTC date-time>.md      machine, exact commands, median table
# A failing command is recorded (rc, stderr tail) and the grid goes on.
#
# Environment (defaults):
#   MODELS="opt-125m opt-1.3b"  BATCHES="1 8 32"  P=128  G=32  REPEAT=1
#   SLUICE=build/sluice  SLUICE_ARGS=""  (extra args appended to sluice bench)
#   BLAS_ENV=auto  ("auto": sluice runs with OPENBLAS_CORETYPE and
#                   OPENBLAS_L2_SIZE unset, so OpenBLAS picks the kernels for
#                   this CPU; "keep": as the environment sets them.  Some
#                   machines pin OPENBLAS_CORETYPE=Haswell for old OpenBLAS
#                   builds, which halves the sgemm rate on AVX-512 CPUs.
#                   HF's torch uses its own BLAS and is not affected.)
#   PYTHON=python3  HF_THREADS=$(nproc)  HF_DTYPE=fp32  HF_ARGS=""
#   TIMEOUT=0 (seconds per command, 0 = none)  OUTDIR=bench/results
#   SKIP_SLUICE=0 / SKIP_HF=0 (1 = do not run that system)
#
# Example: MODELS=opt-125m BATCHES="1 8" REPEAT=3 bench/cpu_compare.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

MODELS=${MODELS:-"opt-125m opt-1.3b"}
BATCHES=${BATCHES:-"1 8 32"}
P=${P:-128}
G=${G:-32}
REPEAT=${REPEAT:-1}
SLUICE=${SLUICE:-build/sluice}
SLUICE_ARGS=${SLUICE_ARGS:-}
BLAS_ENV=${BLAS_ENV:-auto}
blas_env=()
if [[ $BLAS_ENV == auto ]]; then
    blas_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
fi
PYTHON=${PYTHON:-python3}
HF_THREADS=${HF_THREADS:-$(nproc)}
HF_DTYPE=${HF_DTYPE:-fp32}
HF_ARGS=${HF_ARGS:-}
TIMEOUT=${TIMEOUT:-0}
OUTDIR=${OUTDIR:-bench/results}
SKIP_SLUICE=${SKIP_SLUICE:-0}
SKIP_HF=${SKIP_HF:-0}

for v in P G REPEAT HF_THREADS TIMEOUT; do
    if ! [[ ${!v} =~ ^[0-9]+$ ]]; then
        echo "cpu_compare: $v must be a non-negative integer (got '${!v}')" >&2
        exit 2
    fi
done
if ((REPEAT < 1)); then
    echo "cpu_compare: REPEAT must be >= 1" >&2
    exit 2
fi
if [[ $SKIP_SLUICE != 1 && ! -x $SLUICE ]]; then
    echo "cpu_compare: warning: $SLUICE is not an executable; sluice runs will be recorded as failed" >&2
fi

mkdir -p "$OUTDIR"
STAMP=$(date -u +%Y%m%d-%H%M%S)
JSONL="$OUTDIR/cpu-$STAMP.jsonl"
MD="$OUTDIR/cpu-$STAMP.md"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
: >"$JSONL"

# ---- machine ------------------------------------------------------------
cpu_model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)
sockets=$(lscpu 2>/dev/null | sed -n 's/^Socket(s):[[:space:]]*//p' | head -n1)
cores_per_socket=$(lscpu 2>/dev/null | sed -n 's/^Core(s) per socket:[[:space:]]*//p' | head -n1)
threads_per_core=$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core:[[:space:]]*//p' | head -n1)
logical_cpus=$(nproc)
mem_kib=$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/meminfo)
gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)
fi
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git_dirty=$(git status --porcelain 2>/dev/null | head -c1 | wc -c)

"$PYTHON" - "$JSONL" "$STAMP" "$cpu_model" "$sockets" "$cores_per_socket" "$threads_per_core" \
    "$logical_cpus" "${mem_kib:-0}" "$gpu" "$git_rev" "$git_dirty" "$MODELS" "$BATCHES" \
    "$P" "$G" "$REPEAT" "$HF_THREADS" "$HF_DTYPE" <<'PY'
import json, sys
(path, stamp, cpu, sockets, cps, tpc, ncpu, mem_kib, gpu, rev, dirty,
 models, batches, p, g, repeat, hf_threads, hf_dtype) = sys.argv[1:19]
rec = {
    "type": "machine", "date_utc": stamp, "cpu_model": cpu,
    "sockets": sockets, "cores_per_socket": cps, "threads_per_core": tpc,
    "logical_cpus": int(ncpu), "mem_total_gib": round(int(mem_kib) / 2**20, 1),
    "gpu": gpu, "git_rev": rev, "git_dirty": int(dirty) > 0,
    "grid": {"models": models.split(), "batches": batches.split(),
             "prompt_len": int(p), "gen_len": int(g), "repeat": int(repeat),
             "hf_threads": int(hf_threads), "hf_dtype": hf_dtype},
}
with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")
PY

# ---- runs ---------------------------------------------------------------
# record SYSTEM MODEL BATCH REP RC CMD STDOUT STDERR SECONDS
record() {
    "$PYTHON" - "$JSONL" "$@" <<'PY'
import json, sys
path, system, model, batch, rep, rc, cmd, out, err, secs = sys.argv[1:11]
result, stdout_tail = None, ""
with open(out, errors="replace") as f:
    lines = f.read().splitlines()
for line in reversed(lines):  # the last line that is a JSON object
    line = line.strip()
    if line.startswith("{"):
        try:
            result = json.loads(line)
            break
        except ValueError:
            pass
if result is None:
    stdout_tail = "\n".join(lines[-5:])
with open(err, errors="replace") as f:
    stderr_tail = "\n".join(f.read().splitlines()[-8:])
rec = {"type": "run", "system": system, "model": model, "batch": int(batch),
       "repeat_idx": int(rep), "cmd": cmd, "rc": int(rc), "wall_s": float(secs),
       "ok": int(rc) == 0 and result is not None, "result": result}
if not rec["ok"]:
    rec["stderr_tail"] = stderr_tail
    rec["stdout_tail"] = stdout_tail
with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")
status = "ok" if rec["ok"] else f"FAILED rc={rc}"
tput = result.get("throughput_tok_s") if isinstance(result, dict) else None
print(f"  {system:15s} {model} B={batch} rep {rep}: {status}"
      + (f", {tput} tok/s" if tput is not None else ""), file=sys.stderr)
PY
}

# run_cmd SYSTEM MODEL BATCH REP CMD...
run_cmd() {
    local system=$1 model=$2 batch=$3 rep=$4
    shift 4
    local cmd_str rc=0 t0 t1
    cmd_str=$(printf '%q ' "$@")
    cmd_str=${cmd_str% }
    t0=$(date +%s.%N)
    if ((TIMEOUT > 0)); then
        timeout "$TIMEOUT" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    else
        "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    fi
    t1=$(date +%s.%N)
    record "$system" "$model" "$batch" "$rep" "$rc" "$cmd_str" "$TMP/out" "$TMP/err" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
}

read -r -a sluice_extra <<<"$SLUICE_ARGS"
read -r -a hf_extra <<<"$HF_ARGS"

for model in $MODELS; do
    for batch in $BATCHES; do
        echo "== $model batch=$batch P=$P G=$G" >&2
        for ((rep = 1; rep <= REPEAT; rep++)); do
            if [[ $SKIP_SLUICE != 1 ]]; then
                run_cmd sluice "$model" "$batch" "$rep" \
                    ${blas_env[@]+"${blas_env[@]}"} "$SLUICE" bench --dummy "$model" --prompt-len "$P" --gen-len "$G" \
                    --batch "$batch" --json ${sluice_extra[@]+"${sluice_extra[@]}"}
            fi
            if [[ $SKIP_HF != 1 ]]; then
                run_cmd hf-transformers "$model" "$batch" "$rep" \
                    "$PYTHON" bench/hf_cpu_bench.py --model "$model" --prompt-len "$P" \
                    --gen-len "$G" --batch "$batch" --threads "$HF_THREADS" \
                    --dtype "$HF_DTYPE" --json ${hf_extra[@]+"${hf_extra[@]}"}
            fi
        done
    done
done

# ---- summary: medians, ratio, markdown ----------------------------------
"$PYTHON" - "$JSONL" "$MD" <<'PY'
import json, statistics, sys
jsonl, md = sys.argv[1], sys.argv[2]
recs = [json.loads(l) for l in open(jsonl) if l.strip()]
mach = next(r for r in recs if r["type"] == "machine")
runs = [r for r in recs if r["type"] == "run"]
grid = mach["grid"]

def med(rs, key):
    vals = [r["result"][key] for r in rs if r["ok"] and isinstance(r["result"].get(key), (int, float))]
    return statistics.median(vals) if vals else None

summaries, cmds = [], {}
for model in grid["models"]:
    for batch in map(int, grid["batches"]):
        cell = {"type": "summary", "model": model, "batch": batch,
                "prompt_len": grid["prompt_len"], "gen_len": grid["gen_len"]}
        for system in ("sluice", "hf-transformers"):
            rs = [r for r in runs if r["system"] == system and r["model"] == model and r["batch"] == batch]
            if rs:
                cmds.setdefault(system, rs[0]["cmd"])
            cell[system] = {
                "n_ok": sum(r["ok"] for r in rs), "n_runs": len(rs),
                "throughput_tok_s": med(rs, "throughput_tok_s"),
                "prefill_s": med(rs, "prefill_s"), "decode_s": med(rs, "decode_s"),
            }
            if system == "sluice":
                cell[system]["gemm_gflops"] = med(rs, "gemm_gflops")
        s, h = cell["sluice"]["throughput_tok_s"], cell["hf-transformers"]["throughput_tok_s"]
        cell["ratio_sluice_over_hf"] = (s / h) if (s is not None and h) else None
        summaries.append(cell)

with open(jsonl, "a") as f:
    for c in summaries:
        f.write(json.dumps(c) + "\n")

def fmt(v, nd=3):
    return "n/a" if v is None else f"{v:.{nd}f}"

L = []
L.append(f"# sluice vs HF transformers (CPU baseline), {mach['date_utc']} UTC\n")
L.append("## Machine\n")
L.append(f"- CPU: {mach['cpu_model'] or 'unknown'} ({mach['sockets']} socket(s) x "
         f"{mach['cores_per_socket']} cores x {mach['threads_per_core']} threads; "
         f"{mach['logical_cpus']} logical CPUs)")
L.append(f"- Memory: {mach['mem_total_gib']} GiB")
L.append(f"- GPU: {mach['gpu'] or 'none found (nvidia-smi)'}")
L.append(f"- sluice git rev: {mach['git_rev']}{' (dirty tree)' if mach['git_dirty'] else ''}")
L.append(f"- Grid: prompt_len={grid['prompt_len']}, gen_len={grid['gen_len']}, "
         f"repeat={grid['repeat']} (medians), HF threads={grid['hf_threads']}, HF dtype={grid['hf_dtype']}\n")
L.append("## Commands (first cell; other cells differ only in --model/--dummy and --batch)\n")
for system, c in cmds.items():
    L.append(f"- {system}: `{c}`")
L.append("\nAll exact commands are in the `cmd` field of every `run` record of the .jsonl file.\n")
L.append("## Results (median over repeats)\n")
L.append("| model | batch | sluice tok/s | HF tok/s | sluice/HF | sluice prefill s | HF prefill s "
         "| sluice decode s | HF decode s | sluice GEMM GFLOP/s | ok runs (sluice/HF) |")
L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for c in summaries:
    s, h = c["sluice"], c["hf-transformers"]
    L.append(f"| {c['model']} | {c['batch']} | {fmt(s['throughput_tok_s'], 2)} | {fmt(h['throughput_tok_s'], 2)} "
             f"| {fmt(c['ratio_sluice_over_hf'], 2)} | {fmt(s['prefill_s'])} | {fmt(h['prefill_s'])} "
             f"| {fmt(s['decode_s'])} | {fmt(h['decode_s'])} | {fmt(s['gemm_gflops'], 1)} "
             f"| {s['n_ok']}/{s['n_runs']} , {h['n_ok']}/{h['n_runs']} |")
failed = [r for r in runs if not r["ok"]]
if failed:
    L.append("\n## Failed runs\n")
    for r in failed:
        tail = (r.get("stderr_tail") or r.get("stdout_tail") or "").strip().splitlines()[-1:] or [""]
        L.append(f"- {r['system']} {r['model']} B={r['batch']} rep {r['repeat_idx']}: rc={r['rc']} {tail[0][:200]}")
L.append("\nthroughput = batch * gen_len / (prefill_s + decode_s); prefill = one forward over the "
         "prompt batch (yields the first token), decode = the other gen_len-1 steps.")
with open(md, "w") as f:
    f.write("\n".join(L) + "\n")
print(md)
PY
echo "wrote $JSONL and $MD" >&2
