#!/usr/bin/env bash
# tests/test_compare_quick.sh SLUICE ROOT - bench/compare.py --quick end to
# end (opt-125m, one budget, one batch): every system runs on the same
# checkpoint and prompts, each run succeeds with tokens/s above 0, the
# Hugging Face runs' greedy tokens are compared with sluice's, and the
# report and its results file are written. Needs a Python with torch,
# transformers and accelerate (SLUICE_COMPARE_PYTHON, else python3;
# tools/compare-venv.sh makes one): skipped, saying so, where there is none.
set -u
sluice=$1
root=$2
py=${SLUICE_COMPARE_PYTHON:-python3}
if ! missing=$("$py" -c 'import importlib.util, sys
m = [n for n in ("torch", "transformers", "accelerate") if importlib.util.find_spec(n) is None]
print(" ".join(m)); sys.exit(1 if m else 0)' 2>/dev/null); then
	echo "SKIP: $py lacks ${missing:-torch, transformers and accelerate} (tools/compare-venv.sh makes a Python for bench/compare.py; SLUICE_COMPARE_PYTHON names it)"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$py" "$root/bench/compare.py" --quick --sluice "$sluice" --work "$tmp/work" --outdir "$tmp/out" \
	--quiet 2>"$tmp/err"; then
	echo "FAIL: compare.py --quick: $(tail -n 5 "$tmp/err")"
	exit 1
fi
"$py" - "$tmp/out" <<'PY'
import glob, json, sys
out = sys.argv[1]
jl = glob.glob(out + "/compare-*.jsonl")
assert len(jl) == 1, jl
md = jl[0][:-len(".jsonl")] + ".md"
recs = [json.loads(l) for l in open(jl[0])]
runs = [r for r in recs if r["type"] == "run"]
systems = {r["system"] for r in runs}
want = {"sluice-auto", "sluice-flexgen", "accelerate", "transformers"}
assert systems == want, f"systems run: {systems}"
bad = [(r["system"], r["rc"], r.get("stderr_tail")) for r in runs if not r["ok"]]
assert not bad, f"failed runs: {bad}"
assert all(r["result"]["throughput_tok_s"] > 0 and r["peak_rss_bytes"] > 0 for r in runs)
ref = [r for r in recs if r["type"] == "reference"]
assert ref and ref[0]["rc"] == 0 and ref[0]["n"] == 4, ref
for r in runs:
    if r["system"] in ("accelerate", "transformers"):
        assert r["agree"]["n"] >= 1, r
    else:
        assert r["result"]["batch"] >= 1 and r["result"]["policy"], r
acc = next(r for r in runs if r["system"] == "accelerate")
# the disk budget: sluice's device arena plus host cap, the rest on disk
assert acc["result"]["max_memory"] == {"cpu": (96 + 64) << 20}, acc["result"]["max_memory"]
assert "disk" in acc["result"]["device_map_bytes"], acc["result"]["device_map_bytes"]
text = open(md).read()
for s in ("| opt-125m | disk | 4 | sluice-auto |", "| opt-125m | disk | 4 | accelerate |",
          "## Ratios", "**published**"):
    assert s in text, s
print("test_compare_quick: ok")
PY
