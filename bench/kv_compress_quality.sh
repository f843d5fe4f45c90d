#!/usr/bin/env bash
# 4-bit compression's accuracy (issue 14) on the bundled trained model:
# held-out perplexity under `sluice score` (the prompt prefilled, the
# continuation fed token by token through the decode path, each new K and V
# quantised as it is written) with the fp32, fp16 and 4-bit caches, with
# 4-bit weights (--compress-weight: each decoder layer's matrices quantised
# at load) alone and with the 4-bit cache ("both"), and with H2O at 20% of
# the prompt (--hh-ratio 0.1 --recent-ratio 0.1) on the fp16 cache, the
# 4-bit cache and both.  The set is bench/h2o_quality.sh's issue set: 48
# passages of 900 characters spread over models/opt-tiny-kjv/heldout.txt,
# first half the prompt, second half the continuation.
#
# Environment (defaults): MODEL=models/opt-tiny-kjv SLUICE=build/sluice
#   THREADS=2 PASSAGES=48 CHARS=900
# Needs python3 (no packages).  Writes bench/results/kv-compress-quality-
# <UTC date-time>.{jsonl,md} (OUT=prefix to write elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/opt-tiny-kjv}
SLUICE=${SLUICE:-build/sluice}
THREADS=${THREADS:-2}
PASSAGES=${PASSAGES:-48}
CHARS=${CHARS:-900}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=${OUT:-bench/results/kv-compress-quality-$stamp}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a private copy, so that a rebuild during the run cannot mix two binaries
cp "$SLUICE" "$tmp/sluice"

# the issue set only (written before h2o_sets.py looks for `tokenizers`)
python3 bench/h2o_sets.py "$MODEL" "$tmp" --passages "$PASSAGES" --chars "$CHARS" \
	>/dev/null 2>&1 || true
[[ -s $tmp/issue.jsonl ]] || { echo "kv_compress_quality.sh: no passages written" >&2; exit 1; }
: >"$out.jsonl"

# score CONFIG [sluice flags...]: one jsonl row
score() {
	local cfg=$1
	shift
	local cmd=("$tmp/sluice" score --backend cpu --threads "$THREADS" --quiet --model "$MODEL"
		--input "$tmp/issue.jsonl" --out "$tmp/r.jsonl" --overwrite --batch-size 8 "$@")
	"${cmd[@]}"
	python3 - "$cfg" "$tmp/r.jsonl" "$SLUICE" "${cmd[@]:1}" >>"$out.jsonl" <<'PY'
import json, math, shlex, sys
cfg, res, shown = sys.argv[1:4]
rows = [json.loads(l) for l in open(res)]
lp = sum(r["sum_logprob"] for r in rows)
nt = sum(len(r["logprobs"]) for r in rows)
cmd = shlex.join([shown] + [a if not a.startswith("/tmp/") else "SETS/" + a.rsplit("/", 1)[1]
                            for a in sys.argv[4:]])
print(json.dumps({"config": cfg, "lines": len(rows), "tokens": nt,
                  "perplexity": math.exp(-lp / nt), "sum_logprob": lp, "cmd": cmd}))
PY
}

score "fp32 cache" --kv-dtype f32
score "fp16 cache"
score "4-bit cache" --compress-cache
score "4-bit weights" --compress-weight
score "both (4-bit weights and cache)" --compress-weight --compress-cache
score "fp16 cache, H2O 20%" --hh-ratio 0.1 --recent-ratio 0.1
score "4-bit cache, H2O 20%" --compress-cache --hh-ratio 0.1 --recent-ratio 0.1
score "both, H2O 20%" --compress-weight --compress-cache --hh-ratio 0.1 --recent-ratio 0.1

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$out.jsonl" "$MODEL" "$PASSAGES" "$CHARS" "$cpu" "$(nproc)" "$("$tmp/sluice" version | head -1)" >"$out.md" <<'PY'
import json, sys
path, model, passages, chars, cpu, ncpu, rev = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
base = next(r["perplexity"] for r in rows if r["config"] == "fp16 cache")
print("# 4-bit weights and KV cache: held-out perplexity\n")
print(f"- model `{model}`, {passages} held-out passages of {chars} characters (bench/h2o_quality.sh's"
      f" issue set), first half the prompt, second half scored token by token through the decode"
      f" path; {rows[0]['tokens']} scored tokens")
print(f"- machine: {cpu}, {ncpu} CPUs; CPU backend; `{rev}`")
print("- command: `bench/kv_compress_quality.sh` (each row's command below; SETS/ is the"
      " folder the script writes the passages to)\n")
print("Weights fp16 unless the row says 4-bit weights, the cache fp16 unless it says otherwise;"
      " / fp16 is the ratio to the fp16 cache row (fp16 weights and cache).\n")
print("| configuration | perplexity | / fp16 |")
print("|---|---:|---:|")
for r in rows:
    print(f"| {r['config']} | {r['perplexity']:.3f} | {r['perplexity'] / base:.4f} |")
print("\nCommands:\n")
for r in rows:
    print(f"- {r['config']}: `{r['cmd']}`")
PY
echo "kv_compress_quality.sh: wrote $out.jsonl and $out.md"
