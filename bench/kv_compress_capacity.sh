#!/usr/bin/env bash
# The 4-bit compressed KV cache's capacity (issue 14) on the CPU backend,
# side by side in one run: the largest batch that a fixed host budget holds
# (`sluice bench --batch max`, the cache in pinned host memory, the weights
# on the device) and its tokens/s, with the fp16 and the 4-bit cache, with
# and without cpu_cache_compute.  The load average before each run is
# recorded (run it on an otherwise idle machine).
#
# Environment (defaults): MODEL=opt-1.3b (a dummy) P=32 G=8 CPU_MEM=64M
#   THREADS=2 SLUICE=build/sluice
# Writes bench/results/kv-compress-capacity-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-opt-1.3b}
P=${P:-32}
G=${G:-8}
CPU_MEM=${CPU_MEM:-64M}
THREADS=${THREADS:-2}
SLUICE=${SLUICE:-build/sluice}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=${OUT:-bench/results/kv-compress-capacity-$stamp}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$SLUICE" "$tmp/sluice"
: >"$out.jsonl"

# run CONFIG [flags...]: one jsonl row (bench --json plus the config, the
# command and the load average before the run)
run() {
	local cfg=$1
	shift
	local cmd=(bench --backend cpu --threads "$THREADS" --dummy "$MODEL" --prompt-len "$P"
		--gen-len "$G" --batch max --percent 100 0 0 100 100 0 --cpu-mem "$CPU_MEM" --json "$@")
	local load
	load=$(cut -d' ' -f1 /proc/loadavg)
	"$tmp/sluice" "${cmd[@]}" >"$tmp/r.json"
	python3 - "$cfg" "$load" "$tmp/r.json" "$SLUICE" "${cmd[@]}" >>"$out.jsonl" <<'PY'
import json, shlex, sys
cfg, load, res, shown = sys.argv[1:5]
d = json.load(open(res))
d = {"config": cfg, "load_before": float(load), **d, "cmd": shlex.join([shown] + sys.argv[5:])}
print(json.dumps(d))
PY
}

run "fp16 cache"
run "4-bit cache" --compress-cache
run "fp16 cache, cpu_cache_compute" --cpu-cache-compute
run "4-bit cache, cpu_cache_compute" --compress-cache --cpu-cache-compute

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
python3 - "$out.jsonl" "$MODEL" "$P" "$G" "$CPU_MEM" "$cpu" "$(nproc)" \
	"$("$tmp/sluice" version | head -1)" >"$out.md" <<'PY'
import json, sys
path, model, p, g, mem, cpu, ncpu, ver = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
def get(r, *keys):
    for k in keys:
        if k in r:
            return r[k]
    return None
print("# The 4-bit compressed KV cache: largest batch and tokens/s\n")
print(f"- dummy `{model}`, prompt {p}, {g} new tokens, `--batch max` under `--cpu-mem {mem}`, the cache"
      f" in pinned host memory (`--percent 100 0 0 100 100 0`), the weights on the device")
print(f"- machine: {cpu}, {ncpu} CPUs; CPU backend; `{ver}`")
print("- command: `bench/kv_compress_capacity.sh` (each row's command below)\n")
print("| cache | batch | tokens/s | host peak bytes | load before |")
print("|---|---:|---:|---:|---:|")
for r in rows:
    tps = get(r, "throughput_tok_s", "tokens_per_s")
    peak = (r.get("peak_bytes") or {}).get("host")
    print(f"| {r['config']} | {r['batch']} | {tps:.2f} | {peak} | {r['load_before']} |")
print("\nCommands:\n")
for r in rows:
    print(f"- {r['config']}: `{r['cmd']}`")
PY
echo "kv_compress_capacity.sh: wrote $out.jsonl and $out.md"
