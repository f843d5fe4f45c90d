#!/usr/bin/env bash
# The KV cache and the activations in each tier on the CPU backend, side
# by side in one run: the same job (weights on the device) with the cache
# on the device, in pinned host memory (copied to the compute device each
# step, or attended in place with --cpu-cache-compute), on disk, and split
# across the three; then the activations (the residual stream) in pinned
# host memory, with the cache on the device and on the host.  sluice bench
# reports tokens/s, the bytes moved and where the time went.
#
# Environment (defaults): MODEL=opt-125m BATCH=32 GBS=8 P=256 G=16
#   DIR=/tmp/sluice-kv-bench SLUICE=build/sluice BLAS_ENV=auto
# Writes bench/results/kv-offload-cpu-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-125m}
BATCH=${BATCH:-32}
GBS=${GBS:-8}
P=${P:-256}
G=${G:-16}
DIR=${DIR:-/tmp/sluice-kv-bench}
SLUICE=${SLUICE:-build/sluice}
BLAS_ENV=${BLAS_ENV:-auto}
blas_env=()
[[ $BLAS_ENV == auto ]] && blas_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/kv-offload-cpu-$stamp
mkdir -p "$DIR" bench/results
: >"$out.jsonl"
placements=(
	"100 0 100 0 100 0"
	"100 0 0 100 100 0"
	"100 0 0 100 100 0 --cpu-cache-compute"
	"100 0 0 0 100 0"
	"100 0 50 25 100 0"
	"100 0 100 0 0 100"
	"100 0 0 100 0 100 --cpu-cache-compute"
)
for pl in "${placements[@]}"; do
	# shellcheck disable=SC2206
	cmd=("${blas_env[@]}" "$SLUICE" bench --dummy "$MODEL" --prompt-len "$P" --gen-len "$G"
		--batch "$BATCH" --gpu-batch-size "$GBS" --num-gpu-batches $((BATCH / GBS))
		--percent $pl --offload-dir "$DIR" --json)
	echo "+ ${cmd[*]}" >&2
	"${cmd[@]}" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["cmd"]=sys.argv[1]; print(json.dumps(d))' "${cmd[*]}" >>"$out.jsonl"
done
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" \
	"$(df -h "$DIR" | awk 'NR==2 {print $1 " (" $2 ")"}')" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = rows[0]["throughput_tok_s"]
with open(sys.argv[2], "w") as f:
    f.write("# The KV cache and the activations in each tier, CPU backend\n\n")
    f.write(f"- machine: {sys.argv[3]}, {sys.argv[4]} cores; offload folder on {sys.argv[5]}\n")
    r0 = rows[0]
    f.write(f"- model {r0['model']}, prompt {r0['prompt_len']}, gen {r0['gen_len']}, batch {r0['batch']} "
            f"in micro-batches; weights on the device; {r0.get('cpu_kernels')} CPU kernels; one run each\n")
    f.write(f"- command (first row): `{r0['cmd']}`\n\n")
    f.write("| cache device / host / disk % | cpu_cache_compute | activations | tok/s | vs on device | decode s | stall s | host->device GB | device->host GB | disk GB read | disk GB written | disk GB/s | probe GB/s | device peak MiB | host peak MiB |\n")
    f.write("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        disk = 100 - r["cache_gpu_percent"] - r["cache_cpu_percent"]
        f.write(f"| {r['cache_gpu_percent']:g} / {r['cache_cpu_percent']:g} / {disk:g} | "
                f"{'yes' if r['cpu_cache_compute'] else 'no'} | "
                f"{'host' if r.get('act_cpu_percent', 0) >= 100 else 'device'} | {r['throughput_tok_s']:.2f} | "
                f"{r['throughput_tok_s']/ref:.2f} | {r['decode_s']:.2f} | {r['stall_s']:.2f} | "
                f"{r['h2d_bytes']/1e9:.2f} | {r['d2h_bytes']/1e9:.3f} | {r['disk_read_bytes']/1e9:.2f} | "
                f"{r['disk_write_bytes']/1e9:.3f} | {r['disk_read_gbps']:.2f} | {r['probe_read_gbps']:.2f} | "
                f"{r['peak_bytes']['device']/2**20:.0f} | {r['peak_bytes']['host']/2**20:.0f} |\n")
print(open(sys.argv[2]).read())
PY
echo "wrote $out.jsonl and $out.md" >&2
