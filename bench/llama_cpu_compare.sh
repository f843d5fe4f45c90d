#!/usr/bin/env bash
# Side-by-side throughput on the CPU for the LLaMA family: sluice against
# Hugging Face transformers on the same dummy Llama checkpoint, in one run.
#
# One command: bench/llama_cpu_compare.sh   (PYTHON must have torch + transformers)
#
# It writes each shape of SHAPES as a real checkpoint folder
# (bench/make_llama_checkpoint.py: config.json and fp16 model.safetensors
# with random weights, kept in CKPT_DIR and reused) and runs
# bench/cpu_compare.sh over those folders, so every run, the interleaving,
# the medians and the results files are that script's:
#   sluice:  $SLUICE bench --backend cpu --model DIR --prompt-len P \
#                --gen-len G --batch B --json          (fp16 weights)
#   HF:      $PYTHON bench/hf_cpu_bench.py --checkpoint DIR --prompt-len P \
#                --gen-len G --batch B --json --dtype D
#            (from_pretrained(DIR), then model.generate; torch's default
#            threads, on the same cores)
# once per word of HF_BLAS, which here defaults to "inherit/auto
# inherit/fp32": transformers' defaults (dtype "auto": the checkpoint's
# fp16, what from_pretrained gives a user of transformers 5) and fp32 (what
# a CPU user may choose instead), each in the OpenBLAS environment this
# shell has.
#
# Results: $OUTDIR/llama-cpu-<UTC date-time>.jsonl and .md (machine,
# versions, commands, the median table with sluice / HF per HF word).
#
# Environment (defaults):
#   SHAPES="llama-2-7b-2l tinyllama"  (also llama-3-8b-2l, llama-small: the
#          shapes of bench/make_llama_checkpoint.py)
#   BATCHES="1 8 32"  P=128  G=32  REPEAT=3  HF_BLAS="inherit/auto inherit/fp32"
#   CKPT_DIR=${XDG_CACHE_HOME:-~/.cache}/sluice/bench-llama  PYTHON=python3
#   and every other variable of bench/cpu_compare.sh (SLUICE, SLUICE_ARGS,
#   HF_ARGS, TIMEOUT, OUTDIR)
# Disk: 1.3 GB (llama-2-7b-2l), 2.2 GB (tinyllama), 3.0 GB (llama-3-8b-2l);
# memory: HF in fp32 holds twice that.  A quick check that it runs:
#   SHAPES=llama-small BATCHES=1 P=16 G=4 REPEAT=1 OUTDIR=/tmp/out bench/llama_cpu_compare.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

SHAPES=${SHAPES:-"llama-2-7b-2l tinyllama"}
CKPT_DIR=${CKPT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/bench-llama}
PYTHON=${PYTHON:-python3}
export HF_BLAS=${HF_BLAS:-"inherit/auto inherit/fp32"}
export PREFIX=${PREFIX:-llama-cpu}
export PYTHON

die() {
	echo "llama_cpu_compare: $*" >&2
	exit 2
}
"$PYTHON" -c 'import torch, transformers, safetensors' 2>/dev/null ||
	die "$PYTHON cannot import torch, transformers and safetensors (set PYTHON to a virtualenv's python)"
mkdir -p "$CKPT_DIR"

models=()
for s in $SHAPES; do
	dir=$CKPT_DIR/$s
	# a folder whose writing finished (the marker is written last)
	if [[ ! -f $dir/.complete ]]; then
		echo "llama_cpu_compare: writing the $s checkpoint in $dir" >&2
		"$PYTHON" bench/make_llama_checkpoint.py "$s" "$CKPT_DIR" >/dev/null ||
			die "could not write the $s checkpoint"
		: >"$dir/.complete"
	fi
	models+=("$dir")
done

MODELS="${models[*]}" exec bash bench/cpu_compare.sh
