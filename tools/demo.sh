#!/usr/bin/env bash
# tools/demo.sh - installs what is missing, builds sluice, and runs the main
# job: batch generation over a JSON Lines file of prompts with the bundled
# default model.  Until a trained model is bundled, that is OPT-125m with
# deterministic dummy weights (the output tokens are noise; the job, its
# batching, its output file and its summary line are real).
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
echo "+ build/sluice generate --dummy opt-125m --prompts tools/demo-prompts.jsonl --out out/demo.jsonl --max-new-tokens 16 --batch-size 4 --overwrite"
build/sluice generate --dummy opt-125m --prompts tools/demo-prompts.jsonl --out out/demo.jsonl \
	--max-new-tokens 16 --batch-size 4 --overwrite
echo "+ head -3 out/demo.jsonl"
head -3 out/demo.jsonl
