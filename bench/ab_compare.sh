#!/usr/bin/env bash
# Two builds of sluice side by side (A: before a change, B: after), on the
# CPU backend: the same bench runs, alternating A and B, ROUNDS times each,
# over placements that exercise every tier (weights on the device, in
# pinned host memory and on disk; the KV cache on the host with and without
# cpu_cache_compute and on disk; activations on the host; micro-batches and
# sep_layer; H2O).  Reports each binary's median tokens/s and B/A, and
# checks that both generate the same tokens (a greedy job of 16 prompts
# under every placement: the JSONL outputs must be identical byte for byte).
#
# Environment (defaults): A=build-before/sluice B=build/sluice MODEL=opt-125m
#   P=64 G=16 BATCH=8 ROUNDS=3 DIR=/tmp/sluice-ab THREADS=$(nproc)
#   ONLY= (an extended regular expression: only the placements it matches)
# Writes bench/results/ab-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${A:-build-before/sluice}
B=${B:-build/sluice}
MODEL=${MODEL:-opt-125m}
P=${P:-64}
G=${G:-16}
BATCH=${BATCH:-8}
ROUNDS=${ROUNDS:-3}
DIR=${DIR:-/tmp/sluice-ab}
THREADS=${THREADS:-$(nproc)}
ONLY=${ONLY:-}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/ab-$stamp
mkdir -p "$DIR/a" "$DIR/b" bench/results
: >"$out.jsonl"
printf '{"w_gpu_percent": 0, "w_cpu_percent": 0, "sep_layer": true}\n' >"$DIR/sep.json"
printf '{"w_gpu_percent": 0, "w_cpu_percent": 0, "sep_layer": false}\n' >"$DIR/whole.json"

# name | placement and policy options
configs=(
	"device|--percent 100 0 100 0 100 0"
	"weights host|--percent 0 100 100 0 100 0"
	"weights disk, sep_layer|--policy DIR/sep.json"
	"weights disk, whole layers|--policy DIR/whole.json"
	"weights 20/40/40, micro 2|--percent 20 40 100 0 100 0 --gpu-batch-size 4 --num-gpu-batches 2"
	"cache host, micro 4|--percent 100 0 0 100 100 0 --gpu-batch-size 4 --num-gpu-batches 2"
	"cache host, cpu_cache_compute|--percent 100 0 0 100 100 0 --cpu-cache-compute"
	"cache disk, act host|--percent 100 0 0 0 0 100"
	"mixed 30/30, H2O 0.2|--percent 30 30 34 33 100 0 --hh-ratio 0.2"
)
if [[ -n $ONLY ]]; then
	keep=()
	for c in "${configs[@]}"; do [[ ${c%%|*} =~ $ONLY ]] && keep+=("$c"); done
	((${#keep[@]})) || { echo "ab_compare.sh: ONLY='$ONLY' matches no placement" >&2; exit 2; }
	configs=("${keep[@]}")
fi

# the tokens: a greedy job under every placement, A and B
python3 - "$DIR/prompts.jsonl" <<'PY'
import json, sys, random
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"id": f"p{i}", "input_ids": [r.randrange(3, 50000) for _ in range(r.randrange(4, 40))]}) + "\n")
PY
# config C: its name in $name, its options in opts
config() {
	name=${1%%|*}
	read -r -a opts <<<"${1#*|}"
	opts=("${opts[@]//DIR/$DIR}")
}
# the binary of version a or b
bin_of() { if [[ $1 == a ]]; then echo "$A"; else echo "$B"; fi; }

same=0 differ=0
for c in "${configs[@]}"; do
	config "$c"
	for v in a b; do
		"$(bin_of $v)" generate --dummy "$MODEL" --prompts "$DIR/prompts.jsonl" --out "$DIR/$v/gen.jsonl" \
			--max-new-tokens 12 --batch-size 8 --offload-dir "$DIR/$v" --quiet --overwrite --threads "$THREADS" "${opts[@]}"
	done
	if cmp -s "$DIR/a/gen.jsonl" "$DIR/b/gen.jsonl"; then
		same=$((same + 1))
	else
		differ=$((differ + 1))
		echo "tokens differ under: $name" >&2
	fi
done

for r in $(seq "$ROUNDS"); do
	for c in "${configs[@]}"; do
		config "$c"
		for v in a b; do
			cmd=("$(bin_of $v)" bench --dummy "$MODEL" --prompt-len "$P" --gen-len "$G" --batch "$BATCH"
				--offload-dir "$DIR/$v" --threads "$THREADS" --json "${opts[@]}")
			echo "+ ${cmd[*]}" >&2
			"${cmd[@]}" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d.update(ab=sys.argv[1], config=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(d))' \
				"$v" "$name" "$r" >>"$out.jsonl"
		done
	done
done

python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" "$A" "$B" "$same" "$differ" \
	"$MODEL" "$P" "$G" "$BATCH" "$ROUNDS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
f = open(sys.argv[2], "w")
cpu, ncpu, a, b, same, differ, model, p, g, batch, rounds = sys.argv[3:]
f.write("# Before and after, side by side (CPU backend)\n\n")
f.write(f"- machine: {cpu}, {ncpu} cores (shared, noisy: compare the ratio, not the absolute figures)\n")
f.write(f"- A (before): `{a}`; B (after): `{b}`; alternating A, B per run, {rounds} rounds\n")
f.write(f"- workload: `sluice bench --dummy {model} --prompt-len {p} --gen-len {g} --batch {batch}` plus each row's options; {rows[0].get('cpu_kernels')} CPU kernels\n")
f.write(f"- tokens: a greedy job of 16 prompts under every placement gave identical outputs in {same} of {int(same) + int(differ)} placements\n\n")
f.write("| placement | A tok/s (median) | B tok/s (median) | B / A | A runs | B runs |\n|---|---:|---:|---:|---|---|\n")
ratios = []
for name in dict.fromkeys(r["config"] for r in rows):
    ta = [r["throughput_tok_s"] for r in rows if r["config"] == name and r["ab"] == "a"]
    tb = [r["throughput_tok_s"] for r in rows if r["config"] == name and r["ab"] == "b"]
    ma, mb = statistics.median(ta), statistics.median(tb)
    ratios.append(mb / ma)
    f.write(f"| {name} | {ma:.2f} | {mb:.2f} | {mb / ma:.3f} | {', '.join(f'{x:.1f}' for x in ta)} | {', '.join(f'{x:.1f}' for x in tb)} |\n")
f.write(f"\nMedian B / A over the placements: {statistics.median(ratios):.3f}\n")
f.close()
print(open(sys.argv[2]).read())
PY
echo "wrote $out.jsonl and $out.md" >&2
[[ $differ == 0 ]]
