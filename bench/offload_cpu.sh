#!/usr/bin/env bash
# Weights streamed from the disk tier on the CPU backend: every decoder
# layer's weights on disk (--percent 0 0 100 0 100 0), a small device budget,
# batches side by side in one run.  sluice bench measures, in the same run,
# the folder's O_DIRECT sequential read bandwidth (the probe), the disk's
# busy time (io_s), the compute's waiting (stall_s) and the wall time.
#
# Environment (defaults): MODEL=opt-1.3b BATCHES="1 4 16 64" P=16 G=8
#   GPU_MEM=1G DIR=/tmp/sluice-offload-bench SLUICE=build/sluice BLAS_ENV=auto
# Writes bench/results/offload-cpu-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-1.3b}
BATCHES=${BATCHES:-"1 4 16 64"}
P=${P:-16}
G=${G:-8}
GPU_MEM=${GPU_MEM:-1G}
DIR=${DIR:-/tmp/sluice-offload-bench}
SLUICE=${SLUICE:-build/sluice}
BLAS_ENV=${BLAS_ENV:-auto}
blas_env=()
[[ $BLAS_ENV == auto ]] && blas_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/offload-cpu-$stamp
mkdir -p "$DIR" bench/results
: >"$out.jsonl"
for b in $BATCHES; do
	cmd=("${blas_env[@]}" "$SLUICE" bench --dummy "$MODEL" --prompt-len "$P" --gen-len "$G"
		--batch "$b" --percent 0 0 100 0 100 0 --offload-dir "$DIR" --gpu-mem "$GPU_MEM" --json)
	echo "+ ${cmd[*]}" >&2
	"${cmd[@]}" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["cmd"]=sys.argv[1]; print(json.dumps(d))' "${cmd[*]}" >>"$out.jsonl"
done
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" \
	"$(df -h "$DIR" | awk 'NR==2 {print $1 " (" $2 ")"}')" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    f.write("# Weights on disk, CPU backend\n\n")
    f.write(f"- machine: {sys.argv[3]}, {sys.argv[4]} cores; offload folder on {sys.argv[5]}\n")
    f.write(f"- model {rows[0]['model']}, prompt {rows[0]['prompt_len']}, gen {rows[0]['gen_len']}, "
            f"all decoder-layer weights on disk, device budget from the command; {rows[0].get('cpu_kernels')} CPU kernels\n")
    f.write(f"- command (first row): `{rows[0]['cmd']}`\n\n")
    f.write("| batch | tok/s | wall s | compute s | io s (disk busy) | stall s | prefill compute / io s | decode compute / io s | disk GB read | disk GB/s | O_DIRECT probe GB/s | disk / probe | overlap max(compute, io)/wall | per phase: sum of max / wall | device peak MiB |\n")
    f.write("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        ov = max(r["compute_s"], r["io_s"]) / r["wall_s"]
        ratio = r["disk_read_gbps"] / r["probe_read_gbps"] if r["probe_read_gbps"] else 0
        f.write(f"| {r['batch']} | {r['throughput_tok_s']:.2f} | {r['wall_s']:.1f} | {r['compute_s']:.1f} | {r['io_s']:.1f} | "
                f"{r['stall_s']:.1f} | {r['prefill_compute_s']:.1f} / {r['prefill_io_s']:.1f} | {r['decode_compute_s']:.1f} / {r['decode_io_s']:.1f} | {r['disk_read_bytes']/1e9:.1f} | {r['disk_read_gbps']:.2f} | {r['probe_read_gbps']:.2f} | "
                f"{100*ratio:.0f}% | {ov:.2f} | {r['phase_bound_s']/r['wall_s']:.2f} | {r['peak_bytes']['device']/2**20:.0f} |\n")
print(open(sys.argv[2]).read())
PY
echo "wrote $out.jsonl and $out.md" >&2
