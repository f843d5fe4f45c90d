#!/usr/bin/env bash
# H2O quality on the bundled trained model, all in one run, side by side:
# perplexity of held-out text under `sluice score` (the prompt is prefilled
# densely, the continuation fed token by token through the decode path, so
# the KV budget bites exactly as in generation) with the full cache, with
# H2O and with a recent-only window of the same budget.
#
#   1. issue     the issue's table: 48 passages of 900 characters, first half
#                the prompt, second half the continuation; full, H2O 20%
#                (--hh-ratio 0.1 --recent-ratio 0.1), H2O 10% (0.05 + 0.05),
#                recent-only 20% and 10% (--hh-ratio 0 --recent-ratio R);
#                also 5% and 40%.
#   2. long      256-token passages (the model's training window), prompt =
#                the first 192 tokens; budgets 5/10/20/40% of the prompt, the
#                heavy-hitter share of the budget 0/25/50/75/100%.
#   3. recall    a copy task a recent window must lose (X, F tokens of other
#                text, X's first 8 tokens; continuation X's other 32 tokens),
#                the same sweep at F = 150 (P = 199) and F = 30 (P = 79), each
#                with its control (X's first occurrence replaced), and the
#                copy's worth with the full cache against F.
#   4. sink      does keeping the first tokens matter: H2O with 1 or 2 heavy
#                tokens against recent-only of the same budget; and, in the
#                reference below, StreamingLLM's first 4 tokens + recent.
#   5. check     an independent PyTorch reference of the model and of the H2O
#                specification (bench/h2o_ref.py) rescoring some runs: the
#                largest difference of a line's summed log-probability; and
#                diagnostics sluice does not print (attention to the first
#                token, where the heavy hitters are, how local attention is).
#
# Token-id sets (2-4) have one prompt length, and ratios are passed as
# (count + 0.5) / P so that sluice's floor(ratio x P) is the intended count.
#
# Environment (defaults): MODEL=models/opt-tiny-kjv SLUICE=build/sluice
#   THREADS=2 PASSAGES=48 CHARS=900 LONG=96 RECALL=64 REF=1 (0: skip 4's
#   reference rows and 5)
# Needs python3 with tokenizers; REF=1 needs torch and safetensors; the plot
# uses matplotlib when importable, else a plain SVG is written.
# Writes bench/results/h2o-quality-<UTC date-time>.{jsonl,md,svg,png} (OUT=prefix
# to write elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/opt-tiny-kjv}
SLUICE=${SLUICE:-build/sluice}
THREADS=${THREADS:-2}
PASSAGES=${PASSAGES:-48}
CHARS=${CHARS:-900}
LONG=${LONG:-96}
RECALL=${RECALL:-64}
REF=${REF:-1}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=${OUT:-bench/results/h2o-quality-$stamp}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
# a private copy, so that a rebuild during the run cannot mix two binaries
cp "$SLUICE" "$tmp/sluice"
sluice_sha=$(sha256sum "$SLUICE" | cut -c1-12)
SLUICE_RUN=$tmp/sluice
export SLUICE_SHOWN=$SLUICE

python3 bench/h2o_sets.py "$MODEL" "$tmp" --passages "$PASSAGES" --chars "$CHARS" \
	--long "$LONG" --recall "$RECALL"
for F in 1 30 80; do
	python3 bench/h2o_sets.py "$MODEL" "$tmp/F$F" --passages 1 --long 1 --recall "$RECALL" \
		--filler "$F" 2>/dev/null
done
: >"$out.jsonl"

# record MODEL SET CONFIG JSON-EXTRA RESULT CMD...: one jsonl row (in the
# command, SETS/ stands for the folder h2o_sets.py wrote)
record() {
	python3 - "$tmp" "$@" >>"$out.jsonl" <<'PY'
import json, math, os, shlex, sys
tmp, model, set_, cfg, extra, res = sys.argv[1:7]
cmd = shlex.join(sys.argv[7:]).replace(tmp + "/sluice", os.environ["SLUICE_SHOWN"]).replace(tmp + "/", "SETS/")
rows = [json.loads(l) for l in open(res)]
lp = [r["sum_logprob"] for r in rows]
nt = [len(r["logprobs"]) for r in rows]
d = {"model": model, "set": set_, "config": cfg, **json.loads(extra),
     "tokens": sum(nt), "perplexity": math.exp(-sum(lp) / sum(nt)),
     "line_sum_logprob": lp, "line_tokens": nt, "cmd": cmd}
print(json.dumps(d))
PY
}

# score MODEL SET CONFIG JSON-EXTRA [sluice flags...]
n=0
score() {
	local model=$1 set=$2 cfg=$3 extra=$4
	shift 4
	local input=$tmp/$set.jsonl
	[[ $set == recall-F* ]] && input=$tmp/F${set#recall-F}/recall.jsonl
	[[ $set == control-F* ]] && input=$tmp/F${set#control-F}/recall-control.jsonl
	local cmd=("$SLUICE_RUN" score --backend cpu --threads "$THREADS" --quiet --model "$model"
		--input "$input" --out "$tmp/r.jsonl" --overwrite --kv-dtype f32 --batch-size 8 "$@")
	local t w
	t=$(date +%s.%N)
	"${cmd[@]}"
	w=$(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),2))" "$t")
	extra=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["wall_s"]=float(sys.argv[2]); print(json.dumps(d))' "$extra" "$w")
	record "$model" "$set" "$cfg" "$extra" "$tmp/r.jsonl" "${cmd[@]}"
	n=$((n + 1))
	printf '  %3d  %-8s %-14s %-52s %6ss\n' "$n" "$set" "$cfg" "$*" "$w" >&2
}

# split MODEL SET P BUDGET% HEAVY-SHARE%: the budget floor(b P) tokens, of them
# round(s B) heavy hitters and the rest recent
split() {
	local model=$1 set=$2 P=$3 b=$4 s=$5
	local B H R
	B=$(awk -v P="$P" -v b="$b" 'BEGIN { print int(P * b / 100) }')
	H=$(awk -v B="$B" -v s="$s" 'BEGIN { print int(B * s / 100 + 0.5) }')
	R=$((B - H))
	local hr=0 rr=0
	((H > 0)) && hr=$(awk -v c="$H" -v P="$P" 'BEGIN { printf "%.6f", (c + 0.5) / P }')
	((R > 0)) && rr=$(awk -v c="$R" -v P="$P" 'BEGIN { printf "%.6f", (c + 0.5) / P }')
	local cfg=h2o
	((H == 0)) && cfg=recent
	score "$model" "$set" "$cfg" \
		"{\"budget_pct\": $b, \"heavy_share_pct\": $s, \"prompt_tokens\": $P, \"heavy\": $H, \"recent\": $R}" \
		--hh-ratio "$hr" --recent-ratio "$rr"
}

echo "1. issue set: $PASSAGES passages of $CHARS characters" >&2
score "$MODEL" issue full '{"budget_pct": 100}'
for b in 5 10 20 40; do
	h=$(awk -v b="$b" 'BEGIN { printf "%g", b / 200 }')
	r=$(awk -v b="$b" 'BEGIN { printf "%g", b / 100 }')
	score "$MODEL" issue h2o "{\"budget_pct\": $b, \"heavy_share_pct\": 50, \"hh_ratio\": $h, \"recent_ratio\": $h}" \
		--hh-ratio "$h" --recent-ratio "$h"
	score "$MODEL" issue recent "{\"budget_pct\": $b, \"heavy_share_pct\": 0, \"hh_ratio\": 0, \"recent_ratio\": $r}" \
		--hh-ratio 0 --recent-ratio "$r"
done

echo "2. long set: $LONG passages, 192 + 64 tokens" >&2
score "$MODEL" long full '{"budget_pct": 100, "prompt_tokens": 192}'
for b in 5 10 20 40; do
	for s in 0 25 50 75 100; do
		split "$MODEL" long 192 "$b" "$s"
	done
done

echo "3. recall sets: $RECALL lines, (49 + F) + 32 tokens, and their controls" >&2
score "$MODEL" recall full '{"budget_pct": 100, "prompt_tokens": 199, "filler": 150}'
score "$MODEL" recall-control full '{"budget_pct": 100, "prompt_tokens": 199, "filler": 150}'
for F in 1 30 80; do
	P=$((1 + 40 + F + 8))
	score "$MODEL" "recall-F$F" full "{\"budget_pct\": 100, \"prompt_tokens\": $P, \"filler\": $F}"
	score "$MODEL" "control-F$F" full "{\"budget_pct\": 100, \"prompt_tokens\": $P, \"filler\": $F}"
done
for pair in recall:recall-control:199 recall-F30:control-F30:79; do
	IFS=: read -r set ctl P <<<"$pair"
	for b in 5 10 20 40; do
		for s in 0 25 50 75 100; do
			split "$MODEL" "$set" "$P" "$b" "$s"
		done
		split "$MODEL" "$ctl" "$P" "$b" 0
		split "$MODEL" "$ctl" "$P" "$b" 50
	done
done

echo "4. sink check: H2O with 1 or 2 heavy tokens against recent-only" >&2
for set in long recall; do
	P=192
	[[ $set == recall ]] && P=199
	for b in 5 10 20; do
		B=$(awk -v P="$P" -v b="$b" 'BEGIN { print int(P * b / 100) }')
		for H in 1 2; do
			R=$((B - H))
			score "$MODEL" "$set" "h2o-sink$H" \
				"{\"budget_pct\": $b, \"prompt_tokens\": $P, \"heavy\": $H, \"recent\": $R}" \
				--hh-ratio "$(awk -v c="$H" -v P="$P" 'BEGIN { printf "%.6f", (c + 0.5) / P }')" \
				--recent-ratio "$(awk -v c="$R" -v P="$P" 'BEGIN { printf "%.6f", (c + 0.5) / P }')"
		done
	done
done

if [[ $REF == 1 ]]; then
	echo "5. reference (bench/h2o_ref.py): cross-check, StreamingLLM rows, diagnostics" >&2
	# ref SET CONFIG JSON-EXTRA ref-args...: reference score, recorded like sluice's
	ref() {
		local set=$1 cfg=$2 extra=$3
		shift 3
		local cmd=(python3 bench/h2o_ref.py score "$MODEL" "$tmp/$set.jsonl" "$tmp/q.jsonl" --threads "$THREADS" "$@")
		"${cmd[@]}"
		record "$MODEL" "$set" "$cfg" "$extra" "$tmp/q.jsonl" "${cmd[@]}"
		echo "       ref $set $cfg $*" >&2
	}
	ref long ref-full '{"engine": "ref", "budget_pct": 100, "prompt_tokens": 192}' --policy full
	ref long ref-h2o '{"engine": "ref", "budget_pct": 20, "heavy_share_pct": 50, "prompt_tokens": 192, "heavy": 19, "recent": 19}' \
		--policy h2o --heavy 19 --recent 19
	ref long ref-recent '{"engine": "ref", "budget_pct": 20, "heavy_share_pct": 0, "prompt_tokens": 192, "heavy": 0, "recent": 38}' \
		--policy h2o --heavy 0 --recent 38
	ref long ref-h2o '{"engine": "ref", "budget_pct": 10, "heavy_share_pct": 100, "prompt_tokens": 192, "heavy": 19, "recent": 0}' \
		--policy h2o --heavy 19 --recent 0
	ref issue ref-h2o '{"engine": "ref", "budget_pct": 20, "heavy_share_pct": 50, "hh_ratio": 0.1, "recent_ratio": 0.1}' \
		--tokenize --hh-ratio 0.1 --recent-ratio 0.1
	for set in long recall; do
		P=192
		[[ $set == recall ]] && P=199
		for b in 5 10 20; do
			B=$(awk -v P="$P" -v b="$b" 'BEGIN { print int(P * b / 100) }')
			ref "$set" ref-streaming4 "{\"engine\": \"ref\", \"budget_pct\": $b, \"prompt_tokens\": $P, \"heavy\": 4, \"recent\": $((B - 4))}" \
				--policy sink --heavy 4 --recent $((B - 4))
		done
	done
	for set in long recall; do
		P=192
		[[ $set == recall ]] && P=199
		B=$(awk -v P="$P" 'BEGIN { print int(P * 20 / 100) }')
		H=$((B / 2))
		python3 bench/h2o_ref.py diag "$MODEL" "$tmp/$set.jsonl" "$tmp/d.json" --threads "$THREADS" \
			--heavy "$H" --recent $((B - H)) --limit 16 >/dev/null
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"model": sys.argv[2], "set": sys.argv[3], "config": "diag", "engine": "ref", "budget_pct": 20, **d}))' \
			"$tmp/d.json" "$MODEL" "$set" >>"$out.jsonl"
		echo "       ref diag $set" >&2
	done
fi

machine="$(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), $(uname -sr)"
sluice_rev="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet -- runtime kernels tools 2>/dev/null || echo ' + local changes'); binary $SLUICE sha256 $sluice_sha"
python3 bench/h2o_report.py "$out.jsonl" "$out" --machine "$machine" --sluice "$sluice_rev" \
	--wall "$(($(date +%s) - t0))" --env "MODEL=$MODEL SLUICE=$SLUICE THREADS=$THREADS PASSAGES=$PASSAGES CHARS=$CHARS LONG=$LONG RECALL=$RECALL REF=$REF"
echo "wrote $out.jsonl, $out.md and the plot next to them" >&2
