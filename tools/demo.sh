#!/usr/bin/env bash
# tools/demo.sh - installs what is missing, builds sluice, and runs the main
# job: batch generation over a JSON Lines file of text prompts with the
# bundled default model, models/opt-tiny-kjv (a tiny OPT trained on the King
# James Bible by tools/train_model.py), sampled at temperature 0.8.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/deps.sh
. tools/deps.sh
if [ ! -f build/build.ninja ]; then
	# shellcheck disable=SC2086
	meson setup build -Dbuildtype=release $SLUICE_MESON_ARGS >/dev/null
fi
ninja -C build >/dev/null
mkdir -p out
cmd=(build/sluice generate --model models/opt-tiny-kjv --prompts tools/demo-prompts.jsonl
	--out out/demo.jsonl --max-new-tokens 40 --batch-size 4 --temperature 0.8 --top-p 0.95
	--seed 1 --stop $'\n' --overwrite)
echo "+ ${cmd[*]}"
"${cmd[@]}"
echo
python3 - out/demo.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    print(f"{o['id']}: ...{o['completion']!r} ({o['finish_reason']})")
PY
