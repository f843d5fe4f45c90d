#!/usr/bin/env bash
# H2O throughput on the CPU backend: under one fixed device budget (on the
# CPU backend the device tier is a budgeted host arena that holds the KV
# cache), the largest batch that fits and its tokens/s, dense cache against
# H2O with a 20% budget (heavy 10% + recent 10%), side by side in one run.
# Blocks run in micro-batches of GBS sequences, so activation memory does
# not grow with the batch and the KV cache is what limits it.
#
# Environment (defaults): MODEL=opt-125m P=512 G=32 GPU_MEM=700M GBS=4
#   BATCHES="4 8 12 16 24 32 48 64 96 128" SLUICE=build/sluice
# Writes bench/results/h2o-throughput-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-125m}
P=${P:-512}
G=${G:-32}
GPU_MEM=${GPU_MEM:-700M}
GBS=${GBS:-4}
BATCHES=${BATCHES:-"4 8 12 16 24 32 48 64 96 128"}
SLUICE=${SLUICE:-build/sluice}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/h2o-throughput-$stamp
: >"$out.jsonl"
for cfg in dense h2o; do
	extra=()
	[[ $cfg == h2o ]] && extra=(--hh-ratio 0.1 --recent-ratio 0.1)
	for b in $BATCHES; do
		cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$SLUICE" bench --backend cpu --dummy "$MODEL"
			--prompt-len "$P" --gen-len "$G" --batch "$b" --gpu-batch-size "$GBS" --gpu-mem "$GPU_MEM"
			--json "${extra[@]}")
		echo "+ ${cmd[*]}" >&2
		if ! res=$("${cmd[@]}" 2>"$out.err"); then
			echo "  batch $b does not fit: $(tail -1 "$out.err")" >&2
			break
		fi
		python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["config"]=sys.argv[2]; d["cmd"]=sys.argv[3]; print(json.dumps(d))' \
			"$res" "$cfg" "${cmd[*]}" >>"$out.jsonl"
	done
done
rm -f "$out.err"
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    r0 = rows[0]
    f.write("# H2O throughput under a fixed device budget (CPU backend)\n\n")
    f.write(f"- {sys.argv[3]}, 2 vCPUs; model {r0['model']} (dummy weights), prompt {r0['prompt_len']}, "
            f"gen {r0['gen_len']}, micro-batches of the policy's gpu_batch_size; OpenBLAS {r0['blas_core']}\n")
    f.write(f"- command (first row): `{r0['cmd']}`\n\n")
    f.write("| cache | batch | tok/s | prefill s | decode s | device peak MiB |\n|---|---:|---:|---:|---:|---:|\n")
    for r in rows:
        f.write(f"| {r['config']} | {r['batch']} | {r['throughput_tok_s']:.2f} | {r['prefill_s']:.1f} | "
                f"{r['decode_s']:.1f} | {r['peak_bytes']['device'] / 2**20:.0f} |\n")
    best = {}
    for r in rows:
        if r["config"] not in best or r["batch"] > best[r["config"]]["batch"]:
            best[r["config"]] = r
    f.write("\nLargest batch that fits: " + ", ".join(
        f"{k} {v['batch']} ({v['throughput_tok_s']:.2f} tok/s)" for k, v in best.items()) + "\n")
print(open(sys.argv[2]).read())
PY
