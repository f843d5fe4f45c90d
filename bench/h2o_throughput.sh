#!/usr/bin/env bash
# H2O throughput on the CPU backend (the H2O issue): the KV cache in pinned
# host memory under one fixed --cpu-mem budget; for the dense cache and for
# H2O 20% (heavy 10% + recent 10%), the largest batch that fits
# (`sluice bench --batch max`, by the model's arithmetic, checked by
# allocating) and its tokens/s, side by side in one run.  Blocks run in
# micro-batches of GBS sequences, so activation memory does not grow with the
# batch and the KV cache is what limits it.
#
# Environment (defaults): MODEL=opt-1.3b P=512 G=32 CPU_MEM=512M GBS=4
#   SLUICE=build/sluice
# Writes bench/results/h2o-throughput-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-1.3b}
P=${P:-512}
G=${G:-32}
CPU_MEM=${CPU_MEM:-512M}
GBS=${GBS:-4}
SLUICE=${SLUICE:-build/sluice}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/h2o-throughput-$stamp
: >"$out.jsonl"
for cfg in dense h2o; do
	extra=()
	[[ $cfg == h2o ]] && extra=(--hh-ratio 0.1 --recent-ratio 0.1)
	cmd=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$SLUICE" bench --backend cpu --dummy "$MODEL"
		--prompt-len "$P" --gen-len "$G" --batch max --gpu-batch-size "$GBS"
		--percent 100 0 0 100 100 0 --cpu-mem "$CPU_MEM" --json "${extra[@]}")
	echo "+ ${cmd[*]}" >&2
	res=$("${cmd[@]}")
	python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["config"]=sys.argv[2]; d["cmd"]=sys.argv[3]; print(json.dumps(d))' \
		"$res" "$cfg" "${cmd[*]}" >>"$out.jsonl"
done
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" "$CPU_MEM" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    r0 = rows[0]
    f.write("# H2O throughput under a fixed host budget (CPU backend)\n\n")
    f.write(f"- {sys.argv[3]}, {sys.argv[4]} vCPUs; model {r0['model']} (dummy weights), prompt {r0['prompt_len']}, "
            f"gen {r0['gen_len']}; weights on the device tier, the KV cache in pinned host memory under "
            f"--cpu-mem {sys.argv[5]}; micro-batches of the policy's gpu_batch_size; CPU kernels {r0.get('cpu_kernels')}; one run each\n")
    f.write(f"- command (first row): `{r0['cmd']}`\n\n")
    f.write("| cache | largest batch | tok/s | prefill s | decode s | decode tok/s | host peak MiB | host->device GB | device peak MiB |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        dtok = r["batch"] * (r["gen_len"] - 1) / r["decode_s"] if r["decode_s"] > 0 else 0
        f.write(f"| {r['config']} | {r['batch']} | {r['throughput_tok_s']:.2f} | {r['prefill_s']:.1f} | "
                f"{r['decode_s']:.1f} | {dtok:.2f} | {r['peak_bytes']['host'] / 2**20:.0f} | "
                f"{r['h2d_bytes'] / 1e9:.2f} | {r['peak_bytes']['device'] / 2**20:.0f} |\n")
    d = {r["config"]: r for r in rows}
    if "dense" in d and "h2o" in d:
        f.write(f"\nH2O 20% against dense: {d['h2o']['batch'] / d['dense']['batch']:.1f}x the batch, "
                f"{d['h2o']['throughput_tok_s'] / d['dense']['throughput_tok_s']:.2f}x the tokens/s.\n")
print(open(sys.argv[2]).read())
PY
echo "wrote $out.jsonl and $out.md" >&2
