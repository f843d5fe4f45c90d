#!/usr/bin/env bash
# Streamed weights staged a whole layer at a time (sep_layer false) against
# half a layer at a time (sep_layer true, the default), side by side in one
# run on the CPU backend: the weights in pinned host memory, then on disk.
# The device peak falls by twice (layer - larger half) of streamed bytes;
# the bytes moved per pass stay the same.
#
# Each configuration runs REPEAT times, interleaved with the others (this
# VM's disk and CPU swing by 2x from minute to minute); the table gives
# medians.
#
# Environment (defaults): MODEL=opt-1.3b BATCH=4 P=128 G=8 REPEAT=3
#   DIR=/tmp/sluice-half-bench SLUICE=build/sluice BLAS_ENV=auto
# Writes bench/results/half-layer-cpu-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-1.3b}
BATCH=${BATCH:-4}
P=${P:-128}
G=${G:-8}
REPEAT=${REPEAT:-3}
DIR=${DIR:-/tmp/sluice-half-bench}
SLUICE=${SLUICE:-build/sluice}
BLAS_ENV=${BLAS_ENV:-auto}
blas_env=()
[[ $BLAS_ENV == auto ]] && blas_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/half-layer-cpu-$stamp
mkdir -p "$DIR" bench/results
: >"$out.jsonl"
for sep in false true; do
	echo "{\"version\": 1, \"sep_layer\": $sep}" >"$DIR/sep-$sep.json"
done
for rep in $(seq "$REPEAT"); do
for pl in "0 100 100 0 100 0" "0 0 100 0 100 0"; do
	for sep in false true; do
		# shellcheck disable=SC2206
		cmd=("${blas_env[@]}" "$SLUICE" bench --dummy "$MODEL" --prompt-len "$P" --gen-len "$G"
			--batch "$BATCH" --policy "$DIR/sep-$sep.json" --percent $pl --offload-dir "$DIR"
			--json)
		echo "+ ${cmd[*]}" >&2
		"${cmd[@]}" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["cmd"]=sys.argv[1]; d["repeat"]=int(sys.argv[2]); print(json.dumps(d))' "${cmd[*]}" "$rep" >>"$out.jsonl"
	done
done
done
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in runs:
    groups.setdefault((r["w_cpu_percent"], r["sep_layer"]), []).append(r)
rows = []
for key, rs in groups.items():
    r = dict(rs[0])
    for k in ("throughput_tok_s", "stall_s"):
        r[k] = statistics.median(x[k] for x in rs)
    r["n"] = len(rs)
    r["tps_all"] = [x["throughput_tok_s"] for x in rs]
    rows.append(r)
with open(sys.argv[2], "w") as f:
    f.write("# Streamed weights: whole layers against half layers (sep_layer), CPU backend\n\n")
    r0 = rows[0]
    f.write(f"- machine: {sys.argv[3]}, {sys.argv[4]} cores\n")
    f.write(f"- model {r0['model']}, prompt {r0['prompt_len']}, gen {r0['gen_len']}, batch {r0['batch']}; "
            f"{r0.get('cpu_kernels')} CPU kernels; {r0['n']} runs each, interleaved; medians\n")
    f.write(f"- command (first row): `{r0['cmd']}`\n\n")
    f.write("| weights | staged | tok/s (median) | tok/s (runs) | vs whole | device peak MiB | saved MiB | host->device GB | disk GB read | stall s (median) |\n")
    f.write("|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
    for i, r in enumerate(rows):
        where = "host" if r["w_cpu_percent"] >= 100 else "disk"
        base = rows[i - 1] if r["sep_layer"] else r
        saved = (base["peak_bytes"]["device"] - r["peak_bytes"]["device"]) / 2**20
        f.write(f"| {where} | {'half layers' if r['sep_layer'] else 'whole layers'} | "
                f"{r['throughput_tok_s']:.2f} | {' '.join(f'{x:.2f}' for x in r['tps_all'])} | "
                f"{r['throughput_tok_s'] / base['throughput_tok_s']:.2f} | "
                f"{r['peak_bytes']['device']/2**20:.1f} | {saved:.1f} | "
                f"{r['h2d_bytes']/1e9:.2f} | {r['disk_read_bytes']/1e9:.2f} | {r['stall_s']:.2f} |\n")
print(open(sys.argv[2]).read())
PY
echo "wrote $out.jsonl and $out.md" >&2
