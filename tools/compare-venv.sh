#!/usr/bin/env bash
# tools/compare-venv.sh [DIR] - the Python environment of bench/compare.py
# (sluice against Hugging Face Accelerate and transformers): a virtualenv in
# DIR (default build-venv-compare) with torch's CPU wheel, transformers,
# accelerate, safetensors and matplotlib from the package index. Nothing in
# sluice's build or its tests needs it: the tests that run compare.py skip,
# saying why, where its Python lacks these (SLUICE_COMPARE_PYTHON names it).
# Then:  DIR/bin/python bench/compare.py --quick
set -euo pipefail
dir=${1:-build-venv-compare}
python3 -m venv "$dir"
"$dir/bin/pip" install -q --upgrade pip
# the CPU build of torch (the default wheel brings CUDA libraries, GBs);
# on a GPU machine install the default wheel instead.  Where the PyTorch
# index cannot be reached (a machine that reaches PyPI only), PyPI's wheel,
# which pulls in CUDA's libraries (a few GB) but runs on the CPU as well.
if ! "$dir/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch; then
	echo "compare-venv: the PyTorch CPU index is out of reach; torch from PyPI (CUDA build, larger)" >&2
	"$dir/bin/pip" install -q torch
fi
"$dir/bin/pip" install -q transformers accelerate safetensors matplotlib
"$dir/bin/python" -c 'import torch, transformers, accelerate, matplotlib
print("compare-venv: torch", torch.__version__, "transformers", transformers.__version__,
      "accelerate", accelerate.__version__)'
