#!/usr/bin/env bash
# Side-by-side throughput on the CPU: sluice against Hugging Face transformers
# as a user runs it (model.generate, the library's defaults, all cores).
#
# One command: bench/cpu_compare.sh   (PYTHON must have torch + transformers)
#
# For every (model, batch) of the grid, REPEAT times, interleaved (the order
# is reversed every other repetition, so a slow minute of a shared machine
# falls on both), it runs
#   sluice, once, with its own CPU kernels (the default GEMM; the OpenBLAS
#   environment does not touch it; SLUICE_ARGS="--cpu-gemm openblas" would):
#     $SLUICE bench --backend cpu --dummy MODEL --prompt-len P \
#         --gen-len G --batch B --json
#   Hugging Face, once per word of HF_BLAS:
#     [env ...] $PYTHON bench/hf_cpu_bench.py --model MODEL --prompt-len P \
#         --gen-len G --batch B --json
# A BLAS word sets the OpenBLAS environment of that Hugging Face run:
# "inherit" (as this shell has it), "unset" (OPENBLAS_CORETYPE and
# OPENBLAS_L2_SIZE removed), or a core name (OPENBLAS_CORETYPE=NAME); a word
# may end in /DTYPE (inherit/fp32, inherit/auto), which that run passes as
# --dtype DTYPE.  The kernels sluice ran are taken
# from its JSON (cpu_kernels, cpu_gemm, blas_core).
# A MODELS word that is a folder with a config.json is a checkpoint: sluice
# runs --model DIR instead of --dummy, HF --checkpoint DIR instead of
# --model (bench/llama_cpu_compare.sh writes such checkpoints).
#
# Results: $OUTDIR/$PREFIX-<UTC date-time>.jsonl (machine, every run, summaries)
# and .md (machine, versions, environment, commands, the median table).
# tokens/s = batch * gen_len / (prefill + decode) on both sides; the ratio
# of a cell is the median over repetitions of sluice / HF run back to back.
# A failing command is recorded (rc, stderr tail) and the grid goes on.
#
# Environment (defaults):
#   MODELS="opt-125m opt-1.3b"  BATCHES="1 8 32"  P=128  G=32  REPEAT=3
#   SLUICE=build/sluice  SLUICE_ARGS=""
#   PYTHON=python3  HF_ARGS=""  HF_BLAS="inherit"
#   TIMEOUT=0 (seconds per command, 0 = none)  OUTDIR=bench/results  PREFIX=cpu
#   SUMMARIZE=FILE.jsonl: only remake FILE.md from the runs in FILE (a run
#                         that was stopped, or a changed table)
# How long, on the busy 2-vCPU VM of 2026-12-03 (load average 5 to 10): the
# opt-125m cells 41 minutes for 3 repetitions (7.5 for batches 1 and 8 at
# load 5); opt-1.3b at batches 1 and 8 21 minutes per repetition; opt-1.3b
# at batch 32 46 minutes per repetition (31 of them sluice with Prescott),
# when sluice ran twice per cell (OpenBLAS as detected, and Haswell); it runs
# once now.  MODELS, BATCHES and REPEAT cut the grid.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

MODELS=${MODELS:-"opt-125m opt-1.3b"}
BATCHES=${BATCHES:-"1 8 32"}
P=${P:-128}
G=${G:-32}
REPEAT=${REPEAT:-3}
SLUICE=${SLUICE:-build/sluice}
SLUICE_ARGS=${SLUICE_ARGS:-}
PYTHON=${PYTHON:-python3}
HF_ARGS=${HF_ARGS:-}
HF_BLAS=${HF_BLAS:-inherit}
TIMEOUT=${TIMEOUT:-0}
OUTDIR=${OUTDIR:-bench/results}
PREFIX=${PREFIX:-cpu}

die() {
	echo "cpu_compare: $*" >&2
	exit 2
}
# summarize JSONL MD: medians, ratios and the markdown table from the runs in JSONL
summarize() {
	"$PYTHON" - "$1" "$2" <<'PY'
import json, statistics, sys
jsonl, md = sys.argv[1], sys.argv[2]
recs = [json.loads(l) for l in open(jsonl) if l.strip()]
recs = [r for r in recs if r["type"] != "summary"]  # a rerun of the summary replaces them
mach = next(r for r in recs if r["type"] == "machine")
runs = [r for r in recs if r["type"] == "run"]
grid = mach["grid"]
if len(grid.get("sluice_blas", [])) > 1:
    sys.exit(f"{jsonl}: written by cpu_compare.sh when it ran sluice once per OpenBLAS environment "
             f"({', '.join(grid['sluice_blas'])}); its .md holds its table")
elapsed = max([r["t_end"] for r in runs], default=mach["t_start"]) - mach["t_start"]
# sluice runs once per cell (a key of its own); HF once per BLAS word
systems = [("sluice", None)] + [("hf", w) for w in grid["hf_blas"]]

def key(s, w):
    return s if s == "sluice" else f"{s}:{w}"

def med(vals):
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None

def cell_runs(sysname, word, model, batch):
    return [r for r in runs if r["system"] == sysname and (sysname == "sluice" or r["blas"] == word)
            and r["model"] == model and r["batch"] == batch]

summaries = []
for model in grid["models"]:
    for batch in grid["batches"]:
        cell = {"type": "summary", "model": model, "batch": batch,
                "prompt_len": grid["prompt_len"], "gen_len": grid["gen_len"], "systems": {}}
        for s, w in systems:
            rs = cell_runs(s, w, model, batch)
            ok = [r["result"] for r in rs if r["ok"]]
            d = {"n_ok": len(ok), "n_runs": len(rs)}
            for k in ("throughput_tok_s", "prefill_s", "decode_s", "gemm_gflops", "cpu_s", "threads"):
                d[k] = med([o.get(k) for o in ok])
            kernels = sorted({" ".join(str(o.get(k)) for k in ("cpu_kernels", "cpu_gemm", "blas_core")
                                       if o.get(k)) for o in ok if o.get("cpu_kernels")})
            if kernels:
                d["kernels"] = kernels
            d["loadavg_1m"] = med([r["loadavg_1m"][0] for r in rs])
            cell["systems"][key(s, w)] = d
        # ratios: median over repetitions of sluice / HF of the same repetition
        for hw in grid["hf_blas"]:
            pairs = []
            for rep in range(1, grid["repeat"] + 1):
                a = [r for r in cell_runs("sluice", None, model, batch) if r["repeat_idx"] == rep and r["ok"]]
                b = [r for r in cell_runs("hf", hw, model, batch) if r["repeat_idx"] == rep and r["ok"]]
                if a and b and b[0]["result"]["throughput_tok_s"]:
                    pairs.append(a[0]["result"]["throughput_tok_s"] / b[0]["result"]["throughput_tok_s"])
            cell.setdefault("ratio_sluice_over_hf", {})[f"sluice/hf:{hw}"] = med(pairs)
        summaries.append(cell)
with open(jsonl, "w") as f:
    for r in recs:
        f.write(json.dumps(r) + "\n")
    for c in summaries:
        f.write(json.dumps(c) + "\n")

def fmt(v, nd=2):
    return "n/a" if v is None else f"{v:.{nd}f}"

words = mach["blas_words"]
def kernels_desc():
    ks = sorted({k for c in summaries for k in c["systems"]["sluice"].get("kernels", [])})
    return ", ".join(f"**{k}**" for k in ks) or "?"

py = mach["python_libs"]
L = [f"# sluice against Hugging Face transformers on the CPU, {mach['date_utc']} UTC\n",
     "## Machine\n",
     f"- CPU: {mach['cpu_model']} (family/model {mach['cpu_family_model']}; "
     f"{mach['sockets']} socket x {mach['cores_per_socket']} cores x {mach['threads_per_core']} "
     f"threads = {mach['logical_cpus']} logical CPUs; AVX-512: {'yes' if mach['avx512'] else 'no'})",
     f"- Memory: {mach['mem_total_gib']} GiB; load average at the start: {' '.join(mach['loadavg_start'])}",
     f"- sluice: {mach['sluice_version']}, git {mach['git_rev']}{' (dirty tree)' if mach['git_dirty'] else ''}",
     f"- Hugging Face: torch {py.get('torch')}, transformers {py.get('transformers')}; torch's BLAS "
     f"{py.get('torch_blas')}, CPU capability {py.get('torch_cpu_capability')}, "
     f"default threads {py.get('torch_default_threads')}",
     "- Environment this script inherited: " + ", ".join(
         f"{k}={v if v is not None else 'unset'}" for k, v in mach["env_inherited"].items()),
     f"- Grid: prompt {grid['prompt_len']}, {grid['gen_len']} new tokens, batches "
     f"{', '.join(map(str, grid['batches']))}; "
     + (f"{grid['repeat']} repetitions, interleaved (order reversed every other one); medians."
        if grid["repeat"] > 1 else "one repetition.")
     + f" The whole run took {elapsed / 60:.1f} min.\n",
     "## Environments\n"]
for s, w in systems:
    if s == "sluice":  # its own GEMM by default: the OpenBLAS environment is not used
        L.append(f"- sluice: the environment inherited; CPU kernels (instruction set, GEMM), "
                 f"as its JSON reports them: {kernels_desc()}")
    else:  # torch does its matrix products with its own BLAS
        b = words.get(w, {})
        L.append(f"- {s}:{w}: OPENBLAS_CORETYPE {b.get('OPENBLAS_CORETYPE') or 'unset'}, "
                 f"OPENBLAS_L2_SIZE {b.get('OPENBLAS_L2_SIZE') or 'unset'}; torch's own BLAS: "
                 f"{py.get('torch_blas')}")
L.append("\n## Commands (first cell; the others differ in the model and the batch)\n")
for s, w in systems:
    rs = [r for r in runs if r["system"] == s and (s == "sluice" or r["blas"] == w)]
    if rs:
        L.append(f"- {key(s, w)}: `{rs[0]['cmd']}`")
hf_first = next((r["result"] for r in runs if r["system"] == "hf" and r["ok"]), None)
if hf_first:
    dtypes = sorted({f"{r['blas']}: {r['result']['dtype']}" for r in runs
                     if r["system"] == "hf" and r["ok"] and "/" in (r["blas"] or "")})
    L.append(f"\nHF runs `model.generate(input_ids, attention_mask, max_new_tokens={grid['gen_len']}, "
             f"min_new_tokens={grid['gen_len']}, do_sample=False)` on "
             f"`{hf_first.get('source', 'AutoModelForCausalLM.from_config(OPTConfig(...))')}`: "
             f"dtype {', '.join(dtypes) if dtypes else hf_first['dtype']}, attention {hf_first['attn_implementation']}, "
             f"{hf_first['threads']} threads (torch's default); libraries mapped: "
             f"{', '.join(hf_first.get('loaded_blas_libs', []))}.")
L.append("\n## Results (medians)\n")
hdr = ["model", "batch", "HF tok/s", "sluice tok/s", "sluice / HF", "prefill s (HF / sluice)",
       "decode s (HF / sluice)", "sluice prefill GEMM GFLOP/s", "HF CPU s", "load (1 min)"]
L.append("| " + " | ".join(hdr) + " |")
L.append("|" + "---|" * 2 + "---:|" * (len(hdr) - 2))
for hw in grid["hf_blas"]:
    for c in summaries:
        h = c["systems"][f"hf:{hw}"]
        s = c["systems"]["sluice"]
        name = c["model"].rstrip("/").rsplit("/", 1)[-1]
        if len(grid["hf_blas"]) > 1:  # which HF run the row compares with
            name += f" (HF {hw})"
        row = [name, str(c["batch"]), fmt(h["throughput_tok_s"]), fmt(s["throughput_tok_s"]),
               fmt(c["ratio_sluice_over_hf"][f"sluice/hf:{hw}"]),
               f"{fmt(h['prefill_s'], 3)} / {fmt(s['prefill_s'], 3)}",
               f"{fmt(h['decode_s'], 3)} / {fmt(s['decode_s'], 3)}", fmt(s["gemm_gflops"], 1)]
        row.append(fmt(h["cpu_s"], 1))
        row.append(fmt(med([x["loadavg_1m"] for x in c["systems"].values()]), 1))
        L.append("| " + " | ".join(row) + " |")
bad = [r for r in runs if not r["ok"]]
if bad:
    L.append("\n## Failed runs\n")
    for r in bad:
        tail = (r.get("stderr_tail") or r.get("stdout_tail") or "").strip().splitlines()[-1:] or [""]
        L.append(f"- {key(r['system'], r['blas'])} {r['model'].rstrip('/').rsplit('/', 1)[-1]} B={r['batch']} rep {r['repeat_idx']}: "
                 f"rc={r['rc']} {tail[0][:200]}")
L.append("\ntokens/s = batch x new tokens / (prefill + decode). sluice: `sluice bench` (after a warm-up, "
         "prefill = the prompt's forward and the first token, decode = the other steps). HF: one "
         "`generate` call timed end to end; prefill = the call's start to its first new token "
         "(a streamer's clock), decode = the rest. A ratio is the median over repetitions of "
         "sluice / HF measured back to back. HF CPU s = the process's CPU time during the call; "
         "when other processes want the cores it grows far beyond the call's work, torch's OpenMP "
         "threads spinning while they wait for a descheduled sibling. load = the 1-minute load "
         "average when the runs started. Every run, with its exact command and load, is in the .jsonl.")
with open(md, "w") as f:
    f.write("\n".join(L) + "\n")
print(md)
PY
}
if [[ -n ${SUMMARIZE:-} ]]; then # the table again, from a finished or interrupted run
	[[ -f $SUMMARIZE && $SUMMARIZE == *.jsonl ]] || die "SUMMARIZE must name a .jsonl file of this script"
	summarize "$SUMMARIZE" "${SUMMARIZE%.jsonl}.md"
	exit 0
fi

for v in P G REPEAT TIMEOUT; do
	[[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a non-negative integer (got '${!v}')"
done
((REPEAT >= 1)) || die "REPEAT must be >= 1"
for w in $HF_BLAS; do
	[[ $w =~ ^[A-Za-z0-9_]+(/[a-z0-9]+)?$ ]] ||
		die "a BLAS word must be inherit, unset or a core name, optionally /DTYPE (got '$w')"
done
[[ -x $SLUICE ]] || die "$SLUICE is not an executable (build it: ninja -C build)"
"$PYTHON" -c 'import torch, transformers' 2>/dev/null ||
	die "$PYTHON cannot import torch and transformers (set PYTHON to a virtualenv's python)"

# blas_env WORD: the env(1) prefix of a BLAS word, one argument per line
blas_env() {
	case ${1%%/*} in
	inherit) ;;
	unset) printf '%s\n' env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ;;
	*) printf '%s\n' env "OPENBLAS_CORETYPE=$1" ;;
	esac
}

mkdir -p "$OUTDIR"
STAMP=$(date -u +%Y%m%d-%H%M%S)
JSONL="$OUTDIR/$PREFIX-$STAMP.jsonl"
MD="$OUTDIR/$PREFIX-$STAMP.md"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
: >"$JSONL"

# ---- machine, versions, environment -------------------------------------
lscpu >"$TMP/lscpu" 2>/dev/null || : >"$TMP/lscpu"
# the OpenBLAS environment that each BLAS word gives
probe='import json, os
print(json.dumps({"OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
                  "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE")}))'
: >"$TMP/blas"
# shellcheck disable=SC2086 # word lists
for w in $(printf "%s\n" $HF_BLAS | sort -u); do
	mapfile -t pre < <(blas_env "$w")
	printf '%s\t%s\n' "$w" "$(${pre[@]+"${pre[@]}"} "$PYTHON" -c "$probe")" >>"$TMP/blas"
done
"$PYTHON" -c 'import json, torch, transformers
print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                  "torch_default_threads": torch.get_num_threads(),
                  "torch_blas": torch.__config__.show().split("BLAS_INFO=")[-1].split(",")[0],
                  "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}))' \
	>"$TMP/pyver" 2>/dev/null
"$PYTHON" - "$JSONL" "$STAMP" "$TMP/lscpu" "$TMP/blas" "$TMP/pyver" \
	"$("$SLUICE" version 2>&1 | head -n1)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
	"$(git status --porcelain 2>/dev/null | head -c1 | wc -c)" \
	"$MODELS" "$BATCHES" "$P" "$G" "$REPEAT" "$HF_BLAS" "$(nproc)" <<'PY'
import json, os, sys, time
(path, stamp, lscpu, blas, pyver, sluice_version, rev, dirty,
 models, batches, p, g, repeat, hf_blas, nproc) = sys.argv[1:16]
lc = {}
for line in open(lscpu):
    k, _, v = line.partition(":")
    lc[k.strip()] = v.strip()
mem_kib = 0
for line in open("/proc/meminfo"):
    if line.startswith("MemTotal:"):
        mem_kib = int(line.split()[1])
rec = {
    "type": "machine", "date_utc": stamp, "t_start": time.time(), "cpu_model": lc.get("Model name", "unknown"),
    "cpu_family_model": f'{lc.get("CPU family", "?")}/{lc.get("Model", "?")}',
    "sockets": lc.get("Socket(s)"), "cores_per_socket": lc.get("Core(s) per socket"),
    "threads_per_core": lc.get("Thread(s) per core"), "logical_cpus": int(nproc),
    "avx512": "avx512f" in lc.get("Flags", ""), "mem_total_gib": round(mem_kib / 2**20, 1),
    "loadavg_start": open("/proc/loadavg").read().split()[:3],
    "git_rev": rev, "git_dirty": int(dirty) > 0, "sluice_version": sluice_version,
    "python_libs": json.load(open(pyver)),
    "blas_words": {w: json.loads(j) for w, j in (l.rstrip("\n").split("\t", 1) for l in open(blas))},
    "env_inherited": {k: os.environ.get(k) for k in (
        "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
        "OMP_WAIT_POLICY", "MKL_NUM_THREADS")},
    "grid": {"models": models.split(), "batches": [int(b) for b in batches.split()],
             "prompt_len": int(p), "gen_len": int(g), "repeat": int(repeat),
             "hf_blas": hf_blas.split()},
}
with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")
PY


# ---- runs ---------------------------------------------------------------
# record SYSTEM WORD MODEL BATCH REP RC CMD STDOUT STDERR SECONDS LOAD0
record() {
	"$PYTHON" - "$JSONL" "$@" <<'PY'
import json, sys, time
path, system, word, model, batch, rep, rc, cmd, out, err, secs, load0 = sys.argv[1:13]
result = None
lines = open(out, errors="replace").read().splitlines()
for line in reversed(lines):  # the last line that is a JSON object
    if line.strip().startswith("{"):
        try:
            result = json.loads(line)
            break
        except ValueError:
            pass
rec = {"type": "run", "system": system, "blas": word or None, "model": model, "batch": int(batch),
       "repeat_idx": int(rep), "cmd": cmd, "rc": int(rc), "wall_s": float(secs), "t_end": time.time(),
       "loadavg_1m": [float(load0), float(open("/proc/loadavg").read().split()[0])],
       "ok": int(rc) == 0 and result is not None, "result": result}
if not rec["ok"]:
    rec["stderr_tail"] = "\n".join(open(err, errors="replace").read().splitlines()[-8:])
    rec["stdout_tail"] = "\n".join(lines[-5:])
with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")
tput = result.get("throughput_tok_s") if isinstance(result, dict) else None
print(f"  {system:6s} {word:8s} {model} B={batch} rep {rep}: "
      + ("ok" if rec["ok"] else f"FAILED rc={rc}")
      + (f", {tput} tok/s" if tput is not None else "") + f" (load {load0})", file=sys.stderr)
PY
}

# run_one SYSTEM WORD MODEL BATCH REP (WORD: HF's BLAS word; empty for sluice)
run_one() {
	local system=$1 word=$2 model=$3 batch=$4 rep=$5 rc=0 t0 t1 load0
	local -a pre=() cmd
	local src=(--dummy "$model") hsrc=(--model "$model")
	if [[ -f $model/config.json ]]; then # a checkpoint folder
		src=(--model "$model") hsrc=(--checkpoint "$model")
	fi
	if [[ $system == sluice ]]; then
		read -r -a extra <<<"$SLUICE_ARGS"
		cmd=("$SLUICE" bench --backend cpu "${src[@]}" --prompt-len "$P" --gen-len "$G"
			--batch "$batch" --json ${extra[@]+"${extra[@]}"})
	else
		mapfile -t pre < <(blas_env "$word")
		read -r -a extra <<<"$HF_ARGS"
		[[ $word == */* ]] && extra+=(--dtype "${word#*/}")
		cmd=("$PYTHON" bench/hf_cpu_bench.py "${hsrc[@]}" --prompt-len "$P" --gen-len "$G"
			--batch "$batch" --json ${extra[@]+"${extra[@]}"})
	fi
	cmd=(${pre[@]+"${pre[@]}"} "${cmd[@]}")
	((TIMEOUT > 0)) && cmd=(timeout "$TIMEOUT" "${cmd[@]}")
	load0=$(cut -d' ' -f1 /proc/loadavg)
	t0=$(date +%s.%N)
	"${cmd[@]}" >"$TMP/out" 2>"$TMP/err" || rc=$?
	t1=$(date +%s.%N)
	record "$system" "$word" "$model" "$batch" "$rep" "$rc" "${cmd[*]}" "$TMP/out" "$TMP/err" \
		"$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$load0"
}

jobs=(sluice) # one run of sluice per cell
for w in $HF_BLAS; do jobs+=("hf $w"); done
for model in $MODELS; do
	for batch in $BATCHES; do
		echo "== $model batch=$batch P=$P G=$G" >&2
		for ((rep = 1; rep <= REPEAT; rep++)); do
			order=("${jobs[@]}")
			if ((rep % 2 == 0)); then # reversed every other repetition
				order=()
				for ((i = ${#jobs[@]} - 1; i >= 0; i--)); do order+=("${jobs[i]}"); done
			fi
			for j in "${order[@]}"; do
				if [[ $j == sluice ]]; then
					run_one sluice "" "$model" "$batch" "$rep"
				else
					run_one hf "${j#hf }" "$model" "$batch" "$rep"
				fi
			done
		done
	done
done

summarize "$JSONL" "$MD"
echo "wrote $JSONL and $MD" >&2
