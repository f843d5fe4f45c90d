#!/usr/bin/env bash
# tests/test_cli.sh SLUICE FIXTURES - the command line end to end: a job on
# a Hugging Face fixture gives Hugging Face's greedy tokens; each bad input
# gives one line on stderr naming the problem, a non-zero exit, and no
# output file.
set -u
sluice=$1
fx=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A good job: prompts from the fixture, compared with transformers' greedy.
python3 - "$fx/opt-pre/golden.json" "$tmp/in.jsonl" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    for i, p in enumerate(g["prompts"]):
        f.write(json.dumps({"id": "p%d" % i, "input_ids": p}) + "\n")
PY
n=$(python3 -c "import json;print(json.load(open('$fx/opt-pre/golden.json'))['greedy_new_tokens'])")
if "$sluice" generate --model "$fx/opt-pre" --prompts "$tmp/in.jsonl" --out "$tmp/out.jsonl" \
	--max-new-tokens "$n" --batch-size 3 --backend cpu --quiet; then
	if python3 - "$fx/opt-pre/golden.json" "$tmp/out.jsonl" <<'PY'; then ok; else bad "generate output differs from Hugging Face"; fi
import json, sys
g = json.load(open(sys.argv[1]))
out = [json.loads(l) for l in open(sys.argv[2])]
assert [o["id"] for o in out] == ["p%d" % i for i in range(len(g["prompts"]))], "ids/order"
for o, want in zip(out, g["greedy"]):
    assert o["output_ids"] == want, (o, want)
PY
else
	bad "generate on opt-pre failed"
fi
if [ -e "$tmp/out.jsonl.partial" ]; then bad "partial output left behind"; else ok; fi

# expect_fail NAME NEEDLE OUT -- args...: exit != 0, one stderr line with NEEDLE, no OUT
expect_fail() {
	local name=$1 needle=$2 out=$3
	shift 4
	"$sluice" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
	local rc=$?
	local lines
	lines=$(wc -l <"$tmp/stderr")
	if [ $rc -eq 0 ]; then
		bad "$name: exit status 0"
	elif [ "$lines" -ne 1 ]; then
		bad "$name: $lines lines on stderr: $(cat "$tmp/stderr")"
	elif ! grep -qF -- "$needle" "$tmp/stderr"; then
		bad "$name: stderr lacks '$needle': $(cat "$tmp/stderr")"
	elif [ -n "$out" ] && { [ -e "$out" ] || [ -e "$out.partial" ]; }; then
		bad "$name: output file left behind"
	else
		ok
	fi
}

gen=(generate --backend cpu --quiet)
expect_fail "missing model" "$tmp/nope/config.json" "$tmp/o1.jsonl" -- \
	"${gen[@]}" --model "$tmp/nope" --prompts "$tmp/in.jsonl" --out "$tmp/o1.jsonl"
printf '{"input_ids": [5, 6]}\n{"input_ids": [5, \n' >"$tmp/broken.jsonl"
expect_fail "malformed line" "broken.jsonl:2: not valid JSON" "$tmp/o2.jsonl" -- \
	"${gen[@]}" --model "$fx/opt-pre" --prompts "$tmp/broken.jsonl" --out "$tmp/o2.jsonl"
printf '{"input_ids": [5, 99999]}\n' >"$tmp/vocab.jsonl"
expect_fail "id outside vocabulary" "outside the vocabulary" "$tmp/o3.jsonl" -- \
	"${gen[@]}" --model "$fx/opt-pre" --prompts "$tmp/vocab.jsonl" --out "$tmp/o3.jsonl"
python3 -c "import json;print(json.dumps({'input_ids':[5]*60}))" >"$tmp/long.jsonl"
expect_fail "prompt too long" "exceeds the model's 64 positions" "$tmp/o4.jsonl" -- \
	"${gen[@]}" --model "$fx/opt-pre" --prompts "$tmp/long.jsonl" --out "$tmp/o4.jsonl" \
	--max-new-tokens 8
expect_fail "output exists" "output file exists" "" -- \
	"${gen[@]}" --model "$fx/opt-pre" --prompts "$tmp/in.jsonl" --out "$tmp/out.jsonl"
expect_fail "unwritable output" "cannot write output" "$tmp/no/dir/o.jsonl" -- \
	"${gen[@]}" --model "$fx/opt-pre" --prompts "$tmp/in.jsonl" --out "$tmp/no/dir/o.jsonl"
: >"$tmp/empty.jsonl"
expect_fail "empty input" "no prompts" "$tmp/o5.jsonl" -- \
	"${gen[@]}" --model "$fx/opt-pre" --prompts "$tmp/empty.jsonl" --out "$tmp/o5.jsonl"
expect_fail "unknown dummy" "unknown model name 'opt-7b'" "" -- \
	bench --dummy opt-7b --backend cpu
expect_fail "bad size" "not a size" "" -- bench --dummy opt-125m --gpu-mem 12Q
if ! "$sluice" version | grep -q cuda; then
	expect_fail "no cuda" "no CUDA support" "" -- bench --dummy opt-125m --backend cuda
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
