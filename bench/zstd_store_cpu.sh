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
# Then what the cost model predicts where this machine cannot measure
# (issue 14: a 16-core machine with a 3 GB/s disk): the measured profile
# with its CPU rates (GEMM curves, attention, memory read, zstd_gbps) scaled
# by 16 / its threads and its disk reads set to WHATIF_DISK GB/s, the same
# policy (and opt-6.7b's) evaluated with a plain store and with
# `sluice policy --evaluate --zstd-store`.  A prediction, not a measurement:
# the report says so.
#
# Environment (defaults): MODEL=opt-1.3b BATCH=8 P=128 G=8 REPEAT=3 LEVEL=1
#   WHATIF_CORES=16 WHATIF_DISK=3
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
WHATIF_CORES=${WHATIF_CORES:-16}
WHATIF_DISK=${WHATIF_DISK:-3}
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
# the cost model on this machine (its profile) and on the what-if one
python3 - "$DIR/profile.json" "$DIR/whatif.json" "$WHATIF_CORES" "$WHATIF_DISK" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
s = float(sys.argv[3]) / p["threads"]
disk = float(sys.argv[4])
for k in ("cpu_gemm_gflops", "attn_decode_gbps", "attn_prefill_gflops", "cpu_attn_gbps", "mem_read_gbps", "zstd_gbps"):
    if p.get(k):
        p[k] *= s
for c in ("gemm", "gemm_q4"):
    if p.get(c):
        p[c]["gflops"] = [g * s for g in p[c]["gflops"]]
p["disk_read_gbps"] = disk
if p.get("disk_segment_read"):
    p["disk_segment_read"]["gbps"] = [disk for _ in p["disk_segment_read"]["gbps"]]
json.dump(p, open(sys.argv[2], "w"), indent=1)
PY
printf '{"gpu_batch_size": %d, "w_gpu_percent": 0, "w_cpu_percent": 0}\n' "$BATCH" >"$DIR/pol.json"
for prof in profile whatif; do
	for m in "$MODEL" opt-6.7b; do
		for z in plain zstd; do
			zf=()
			[[ $z == zstd ]] && zf=(--zstd-store)
			"$SLUICE" policy --dummy "$m" --backend cpu --prompt-len "$P" --gen-len "$G" --offload-dir "$DIR" \
				--profile "$DIR/$prof.json" --evaluate "$DIR/pol.json" "${zf[@]}" --json |
				python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"whatif": sys.argv[1], "model": sys.argv[2], "store": sys.argv[3], "throughput_tok_s": d["throughput_tok_s"], "decode_bottleneck": d["phases"]["decode"]["bottleneck"], "zstd_store": d["zstd_store"]}))' \
					"$prof" "$m" "$z" >>"$out.jsonl"
		done
	done
done
python3 - "$out.jsonl" "$out.md" "$(lscpu | sed -n 's/^Model name: *//p')" "$(nproc)" "$(cat /proc/loadavg)" "$DIR/profile.json" "$WHATIF_CORES" "$WHATIF_DISK" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
stores = {r["store"]: r for r in recs if "store" in r and "whatif" not in r}
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
wi = [r for r in recs if "whatif" in r]
if wi:
    L += ["", "## What the cost model predicts (not measured)", "",
          "`sluice policy --evaluate` of the same placement (every decoder layer's weights on disk, "
          f"batch {runs[0]['cmd'].split('--batch ')[1].split()[0]}, the same workload), a plain store against "
          "`--zstd-store`: with this machine's profile, and with a what-if profile: its CPU rates (GEMM curves, "
          "attention, memory read, zstd decompression) scaled linearly to "
          f"{sys.argv[7]} cores (x{float(sys.argv[7]) / prof['threads']:g}) and its disk reads at {sys.argv[8]} GB/s "
          "(on the CPU backend decompression runs on the compute's cores, in its chain).", "",
          "| profile | model | plain tok/s | zstd tok/s | zstd vs plain | decode bound by (plain, zstd) |",
          "|---|---|---:|---:|---:|---|"]
    for w in ("profile", "whatif"):
        for m in dict.fromkeys(r["model"] for r in wi):
            a = [r for r in wi if r["whatif"] == w and r["model"] == m and r["store"] == "plain"][0]
            b = [r for r in wi if r["whatif"] == w and r["model"] == m and r["store"] == "zstd"][0]
            L.append(f"| {'this machine' if w == 'profile' else 'what-if'} | {m} | {a['throughput_tok_s']:.2f} | "
                     f"{b['throughput_tok_s']:.2f} | {b['throughput_tok_s'] / a['throughput_tok_s']:.2f} | "
                     f"{a['decode_bottleneck']}, {b['decode_bottleneck']} |")
open(sys.argv[2], "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
echo "wrote $out.jsonl and $out.md" >&2
