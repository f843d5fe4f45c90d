#!/usr/bin/env bash
# H2O quality on the bundled trained model: perplexity of held-out text
# (sluice score: each passage's first half is the prompt, the second half
# the continuation, fed token by token through the decode path) with the
# full cache, with H2O at KV budgets of 20% and 10% of the prompt (half
# heavy hitters, half recent), and with recent-only windows of the same
# budgets.  All in one run.
#
# Environment (defaults): MODEL=models/opt-tiny-kjv PASSAGES=48 CHARS=900
#   (passages stay under the 256 positions the bundled model was trained on)
#   SLUICE=build/sluice
# Writes bench/results/h2o-quality-<UTC date-time>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/opt-tiny-kjv}
PASSAGES=${PASSAGES:-48}
CHARS=${CHARS:-900}
SLUICE=${SLUICE:-build/sluice}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/h2o-quality-$stamp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$MODEL/heldout.txt" "$PASSAGES" "$CHARS" "$tmp/in.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
n, chars = int(sys.argv[2]), int(sys.argv[3])
step = max(chars, (len(text) - chars) // n)
with open(sys.argv[4], "w") as f:
    for i in range(n):
        s = text[i * step:i * step + chars]
        cut = s.rfind(" ", 0, chars // 2)
        f.write(json.dumps({"id": i, "prompt": s[:cut], "continuation": s[cut:]}) + "\n")
PY
: >"$out.jsonl"
run() { # name args...
	local name=$1
	shift
	"$SLUICE" score --backend cpu --quiet --model "$MODEL" --input "$tmp/in.jsonl" \
		--out "$tmp/$name.jsonl" --kv-dtype f32 --batch-size 8 "$@"
	python3 - "$tmp/$name.jsonl" "$name" "$*" >>"$out.jsonl" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
lp = sum(r["sum_logprob"] for r in rows)
n = sum(len(r["logprobs"]) for r in rows)
print(json.dumps({"config": sys.argv[2], "flags": sys.argv[3], "tokens": n,
                  "perplexity": math.exp(-lp / n)}))
PY
}
run full
run h2o-20 --hh-ratio 0.1 --recent-ratio 0.1
run recent-20 --hh-ratio 0 --recent-ratio 0.2
run h2o-10 --hh-ratio 0.05 --recent-ratio 0.05
run recent-10 --hh-ratio 0 --recent-ratio 0.1
run h2o-5 --hh-ratio 0.025 --recent-ratio 0.025
run recent-5 --hh-ratio 0 --recent-ratio 0.05
python3 - "$out.jsonl" "$out.md" "$MODEL" "$PASSAGES" "$CHARS" "$(lscpu | sed -n 's/^Model name: *//p')" <<'PY'
import json, sys
rows = {r["config"]: r for r in map(json.loads, open(sys.argv[1]))}
full = rows["full"]["perplexity"]
with open(sys.argv[2], "w") as f:
    f.write("# H2O quality: held-out perplexity against the KV budget\n\n")
    f.write(f"- model `{sys.argv[3]}`, {sys.argv[4]} held-out passages of {sys.argv[5]} characters, "
            f"first half the prompt, second half scored token by token through the decode path; "
            f"{rows['full']['tokens']} scored tokens; fp32 KV cache; CPU backend ({sys.argv[6]})\n")
    f.write("- command: `bench/h2o_quality.sh` (each row: `sluice score ... FLAGS`)\n")
    f.write("- budget = share of the prompt length kept per layer, sequence and head "
            "(H2O: half heavy hitters, half recent; recent-only: the most recent tokens)\n\n")
    f.write("| KV budget | full cache | H2O | recent only | H2O / full | recent-only / full |\n|---|---:|---:|---:|---:|---:|\n")
    for b in ("20", "10", "5"):
        h, r = rows[f"h2o-{b}"]["perplexity"], rows[f"recent-{b}"]["perplexity"]
        f.write(f"| {b}% | {full:.3f} | {h:.3f} | {r:.3f} | {h / full:.3f} | {r / full:.3f} |\n")
print(open(sys.argv[2]).read())
PY
echo "wrote $out.jsonl and $out.md" >&2
