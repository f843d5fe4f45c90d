#!/usr/bin/env bash
# A weight store of zstd frames (sluice convert --zstd) against the plain
# store, side by side in one run on the CPU backend: every decoder layer's
# weights on disk, the same model, batch and workload.  Reports each
# store's size (the compression ratio), the time to write it, and per run
# tokens/s, the bytes read from disk and the time compute waited for
# weights (the reads, and for the zstd store the decompression), beside
# the cost model's prediction of each (a profile measured first, with the
# offload folder's disk: zstd_gbps is its decompression rate).
#
# Each store runs REPEAT times, interleaved (this VM's disk and CPU swing
# from minute to minute); the table gives medians.
#
# Environment (defaults): MODEL=opt-1.3b BATCH=8 P=128 G=8 REPEAT=3 LEVEL=1
#   DIR=/tmp/sluice-zstd-bench SLUICE=build/sluice BLAS_ENV=auto
# Writes bench/results/zstd-store-cpu-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-1.3b}
BATCH=${BATCH:-8}
P=${P:-128}
G=${G:-8}
REPEAT=${REPEAT:-3}
LEVEL=${LEVEL:-1}
DIR=${DIR:-/tmp/sluice-zstd-bench}
SLUICE=${SLUICE:-build/sluice}
BLAS_ENV=${BLAS_ENV:-auto}
blas_env=()
[[ $BLAS_ENV == auto ]] && blas_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/zstd-store-cpu-$stamp
pl=(--percent 0 0 100 0 100 0)
rm -rf "$DIR"
mkdir -p "$DIR/plain" "$DIR/zstd" bench/results
: >"$out.jsonl"
for kind in plain zstd; do
	z=()
	[[ $kind == zstd ]] && z=(--zstd="$LEVEL")
	t0=$(date +%s.%N)
	"$SLUICE" convert --dummy "$MODEL" "${pl[@]}" --offload-dir "$DIR/$kind" "${z[@]}" >&2
	t1=$(date +%s.%N)
	f=$(ls "$DIR/$kind"/*.weights.sluice)
	# the frames keep their plain offsets, so the file's length is the
	# plain store's: its allocated blocks are what it occupies
	echo "{\"store\": \"$kind\", \"file\": \"$f\", \"bytes\": $(stat -c %s "$f"), \"alloc_bytes\": $(($(stat -c '%b * %B' "$f"))), \"write_s\": $(echo "$t1 - $t0" | bc)}" >>"$out.jsonl"
done
"${blas_env[@]}" "$SLUICE" profile --offload-dir "$DIR" --json "$DIR/profile.json" >&2
for rep in $(seq "$REPEAT"); do
	for kind in plain zstd; do
		cmd=("${blas_env[@]}" "$SLUICE" bench --dummy "$MODEL" --prompt-len "$P" --gen-len "$G"
			--batch "$BATCH" "${pl[@]}" --offload-dir "$DIR/$kind" --profile "$DIR/profile.json" --json)
		echo "+ ${cmd[*]}" >&2
		"${cmd[@]}" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["cmd"]=sys.argv[1]; d["repeat"]=int(sys.argv[2]); d["kind"]=sys.argv[3]; print(json.dumps(d))' "${cmd[*]}" "$rep" "$kind" >>"$out.jsonl"
	done
done
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" "$(cat /proc/loadavg)" "$DIR/profile.json" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
stores = {r["store"]: r for r in recs if "store" in r}
runs = [r for r in recs if "kind" in r]
med = lambda xs: statistics.median(xs)
L = ["# zstd weight store against the plain store, CPU backend", "",
     f"- machine: {sys.argv[3]}, {sys.argv[4]} cores; load average at the end {sys.argv[5]}",
     f"- command (first run): `{runs[0]['cmd']}`; `sluice convert --dummy ... --percent 0 0 100 0 100 0 [--zstd]` first",
     f"- {len(runs) // 2} runs each, interleaved; medians", "",
     "| store | occupies MiB | ratio | write s | tok/s (median) | tok/s (runs) | vs plain | predicted tok/s | predicted vs plain | disk MB read | decode s | stall s |",
     "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
prof = json.load(open(sys.argv[6]))
pbase = None
base = None
for kind in ("plain", "zstd"):
    rs = [r for r in runs if r["kind"] == kind]
    s = stores[kind]
    tps = med([r["throughput_tok_s"] for r in rs])
    base = base or tps
    ptps = med([r["predicted_throughput_tok_s"] for r in rs])
    pbase = pbase or ptps
    L.append(f"| {kind} | {s['alloc_bytes'] / 2**20:.0f} | {stores['plain']['alloc_bytes'] / s['alloc_bytes']:.3f} | {s['write_s']:.1f} | "
             f"{tps:.2f} | {' '.join('%.2f' % r['throughput_tok_s'] for r in rs)} | {tps / base:.2f} | {ptps:.2f} | {ptps / pbase:.2f} | "
             f"{med([r['disk_read_bytes'] for r in rs]) / 1e6:.0f} | {med([r['decode_s'] for r in rs]):.2f} | "
             f"{med([r.get('stall_s', 0) for r in rs]):.2f} |")
L += ["", f"- profile: zstd_gbps {prof['zstd_gbps']:.2f}, zstd_ratio {prof['zstd_ratio']:.3f} (synthetic), disk_read_gbps {prof['disk_read_gbps']:.2f}, load at its start {prof.get('load_average')}"]
open(sys.argv[2], "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
echo "wrote $out.jsonl and $out.md" >&2
