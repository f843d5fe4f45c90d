#!/usr/bin/env bash
# 4-bit compression's capacity (issue 14) on the CPU backend, side by side
# in one run: the largest batch that fixed budgets hold (`sluice bench
# --batch max`), its tokens/s and the bytes read from disk per generated
# token.  The 1-minute load average before and after each run is recorded
# (run it on an otherwise idle machine: tokens/s is one sample each).
#
# GRID picks the runs:
#   cache    (default) the KV cache in pinned host memory under --cpu-mem
#            (64M), the weights on the device: the fp16 and the 4-bit cache,
#            with and without cpu_cache_compute.
#   weights  issue 14's grid: dummy opt-1.3b with every decoder layer's
#            weights on disk (--offload-dir, a folder under the run's temp
#            dir) and in host memory, the cache and the activations on the
#            device, under --gpu-mem 352M and --cpu-mem 3G (the host holds
#            fp16 weights): fp16, 4-bit weights (--compress-weight), the
#            4-bit cache (--compress-cache) and both.  The device budget
#            holds the weights' two staging slots, the activations and the
#            cache, so compressed weights (smaller slots) and a compressed
#            cache (smaller rows) both raise the batch; it is small enough
#            that the batches stay short to run on two cores.
#
# Environment (defaults): GRID=cache MODEL=opt-1.3b (a dummy) P=32 G=8
#   CPU_MEM=64M (cache grid) or 3G (weights grid) GPU_MEM=352M (weights grid)
#   THREADS=2 SLUICE=build/sluice
# Writes bench/results/kv-compress-capacity-<UTC date-time>.{jsonl,md}
# (GRID=weights: compress-capacity-...; OUT=prefix to write elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
GRID=${GRID:-cache}
MODEL=${MODEL:-opt-1.3b}
P=${P:-32}
G=${G:-8}
THREADS=${THREADS:-2}
SLUICE=${SLUICE:-build/sluice}
stamp=$(date -u +%Y%m%d-%H%M%S)
case $GRID in
cache)
	CPU_MEM=${CPU_MEM:-64M}
	out=${OUT:-bench/results/kv-compress-capacity-$stamp}
	;;
weights)
	CPU_MEM=${CPU_MEM:-3G}
	GPU_MEM=${GPU_MEM:-352M}
	out=${OUT:-bench/results/compress-capacity-$stamp}
	;;
*)
	echo "kv_compress_capacity.sh: GRID=$GRID: not cache or weights" >&2
	exit 2
	;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$SLUICE" "$tmp/sluice"
mkdir -p "$tmp/offload"
: >"$out.jsonl"

# run WEIGHTS CONFIG [flags...]: one jsonl row (bench --json plus where the
# weights are, the config, the command and the load average before and
# after the run)
run() {
	local where=$1 cfg=$2
	shift 2
	local cmd=(bench --backend cpu --threads "$THREADS" --dummy "$MODEL" --prompt-len "$P"
		--gen-len "$G" --batch max --json "$@")
	local load
	load=$(cut -d' ' -f1 /proc/loadavg)
	"$tmp/sluice" "${cmd[@]}" >"$tmp/r.json"
	python3 - "$where" "$cfg" "$load" "$(cut -d' ' -f1 /proc/loadavg)" "$tmp/r.json" "$SLUICE" \
		"${cmd[@]}" >>"$out.jsonl" <<'PY'
import json, shlex, sys
where, cfg, load, after, res, shown = sys.argv[1:7]
d = json.load(open(res))
args = ["OFFLOAD" if a.endswith("/offload") else a for a in sys.argv[7:]]
d = {"weights": where, "config": cfg, "load_before": float(load), "load_after": float(after),
     **d, "cmd": shlex.join([shown] + args)}
print(json.dumps(d))
PY
}

case $GRID in
cache)
	host=(--percent 100 0 0 100 100 0 --cpu-mem "$CPU_MEM")
	run device "fp16 cache" "${host[@]}"
	run device "4-bit cache" "${host[@]}" --compress-cache
	run device "fp16 cache, cpu_cache_compute" "${host[@]}" --cpu-cache-compute
	run device "4-bit cache, cpu_cache_compute" "${host[@]}" --compress-cache --cpu-cache-compute
	what="the cache in pinned host memory (\`--percent 100 0 0 100 100 0\`) under \`--cpu-mem $CPU_MEM\`, the weights on the device"
	;;
weights)
	budget=(--gpu-mem "$GPU_MEM" --cpu-mem "$CPU_MEM")
	for w in disk host; do
		if [[ $w == disk ]]; then
			place=(--percent 0 0 100 0 100 0 --offload-dir "$tmp/offload")
		else
			place=(--percent 0 100 100 0 100 0)
		fi
		run "$w" "fp16" "${place[@]}" "${budget[@]}"
		run "$w" "4-bit weights" "${place[@]}" "${budget[@]}" --compress-weight
		run "$w" "4-bit cache" "${place[@]}" "${budget[@]}" --compress-cache
		run "$w" "both" "${place[@]}" "${budget[@]}" --compress-weight --compress-cache
	done
	what="every decoder layer's weights on disk (\`--percent 0 0 100 0 100 0\`, OFFLOAD a folder under the run's temp dir) or in host memory (\`--percent 0 100 100 0 100 0\`), the cache and the activations on the device, under \`--gpu-mem $GPU_MEM --cpu-mem $CPU_MEM\`"
	;;
esac

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$out.jsonl" "$GRID" "$MODEL" "$P" "$G" "$what" "$cpu" "$(nproc)" \
	"$(df -h "$tmp" | awk 'NR==2 {print $1 " (" $2 ")"}')" \
	"$("$tmp/sluice" version | head -1)" >"$out.md" <<'PY'
import json, sys
path, grid, model, p, g, what, cpu, ncpu, disk, ver = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
if grid == "cache":
    print("# The 4-bit compressed KV cache: largest batch and tokens/s\n")
else:
    print("# 4-bit weights and KV cache: largest batch, tokens/s, disk bytes per token\n")
print(f"- dummy `{model}`, prompt {p}, {g} new tokens, one round, `--batch max` with {what}")
print(f"- machine: {cpu}, {ncpu} CPUs, offload folder on {disk}; CPU backend; `{ver}`")
print(f"- command: `GRID={grid} bench/kv_compress_capacity.sh` (each row's command below)")
print("- tokens/s is one sample per row on a shared machine: the 1-minute load average"
      " before and after each run is beside it (the run's own threads count in the after)\n")
print("| weights | config | batch | tokens/s | disk bytes read / generated token"
      " | host-to-device bytes / generated token | weight bytes | device peak | host peak"
      " | load before / after |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    peak = r.get("peak_bytes") or {}
    ntok = r["batch"] * r["gen_len"]
    print(f"| {r['weights']} | {r['config']} | {r['batch']} | {r['throughput_tok_s']:.2f}"
          f" | {r['disk_read_bytes'] / ntok:.0f} | {r['h2d_bytes'] / ntok:.0f}"
          f" | {r['weight_bytes']} | {peak.get('device')} | {peak.get('host')}"
          f" | {r['load_before']} / {r['load_after']} |")
print("\nCommands:\n")
for r in rows:
    print(f"- {r['weights']}, {r['config']}: `{r['cmd']}`")
PY
echo "kv_compress_capacity.sh: wrote $out.jsonl and $out.md"
