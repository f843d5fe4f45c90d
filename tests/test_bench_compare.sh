#!/usr/bin/env bash
# tests/test_bench_compare.sh SLUICE ROOT - bench/cpu_compare.sh, the
# sluice-against-Hugging-Face comparison, with stand-ins for sluice and for
# the Hugging Face harness (no torch needed): the baseline runs with the
# library's defaults (no thread count, no dtype) in the environment it
# inherits; sluice runs once, with its own kernels, interleaved with the
# baseline (order reversed every other repetition); the results name the
# CPU kernels sluice reported, the ratio is sluice / HF, and a failing run
# is recorded while the grid goes on.
set -u
sluice=$1
root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

mkdir -p "$tmp/bin" "$tmp/py/torch" "$tmp/py/transformers" "$tmp/out"
log=$tmp/log

# sluice stand-in: logs its arguments and OpenBLAS environment; 100 tok/s;
# batch 32 fails
cat >"$tmp/bin/sluice" <<EOF
#!/usr/bin/env bash
if [[ \$1 == version ]]; then echo "sluice 0.0.0-stand-in"; exit 0; fi
echo "sluice \$* | CORETYPE=\${OPENBLAS_CORETYPE-(unset)} L2=\${OPENBLAS_L2_SIZE-(unset)}" >>"$log"
if [[ " \$* " == *" --batch 32 "* ]]; then echo "sluice: out of memory (stand-in)" >&2; exit 1; fi
echo "{\"throughput_tok_s\": 100, \"prefill_s\": 1.0, \"decode_s\": 2.0, \"gemm_gflops\": 10.0,
      \"cpu_kernels\": \"avx2\", \"cpu_gemm\": \"sluice\", \"blas_core\": null}" | tr -d '\n'
echo
EOF
# python stand-in: the HF harness is replaced, everything else runs in python3
# with stand-in torch and transformers modules
cat >"$tmp/bin/python" <<EOF
#!/usr/bin/env bash
if [[ \${1-} == bench/hf_cpu_bench.py ]]; then
	shift
	echo "hf \$* | CORETYPE=\${OPENBLAS_CORETYPE-(unset)} L2=\${OPENBLAS_L2_SIZE-(unset)}" >>"$log"
	echo '{"throughput_tok_s": 40, "prefill_s": 1.5, "decode_s": 2.5, "cpu_s": 8.0, "threads": 2,
	       "dtype": "float32", "attn_implementation": "sdpa", "loaded_blas_libs": ["libgomp.so.1"]}' | tr -d '\n'
	echo
	exit 0
fi
PYTHONPATH="$tmp/py" exec python3 "\$@"
EOF
cat >"$tmp/py/torch/__init__.py" <<'EOF'
__version__ = "0.0-stand-in"
class _Config:
    @staticmethod
    def show():
        return "Build settings: BLAS_INFO=stand-in, LAPACK_INFO=none"
__config__ = _Config()
class _Cpu:
    @staticmethod
    def get_cpu_capability():
        return "NONE"
class backends:
    cpu = _Cpu()
def get_num_threads():
    return 2
EOF
echo '__version__ = "0.0-stand-in"' >"$tmp/py/transformers/__init__.py"
chmod +x "$tmp/bin/sluice" "$tmp/bin/python"

# as on the development machines: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE set
(cd "$root" && OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=1048576 MODELS=opt-125m BATCHES="1 32" \
	P=16 G=4 REPEAT=2 SLUICE="$tmp/bin/sluice" PYTHON="$tmp/bin/python" \
	OUTDIR="$tmp/out" bash bench/cpu_compare.sh) >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
if ((rc == 0)); then ok; else bad "cpu_compare.sh exited $rc: $(tail -n 3 "$tmp/stderr")"; fi
md=$(find "$tmp/out" -name "cpu-*.md" | head -n 1)
jsonl=${md%.md}.jsonl
if [[ -f $md && -f $jsonl ]]; then ok; else bad "no cpu-*.md and .jsonl written"; fi

# the runs, in order: for each batch, rep 1 sluice, HF; rep 2 the reverse;
# both in the environment inherited (sluice's own GEMM does not read it)
args() { echo "--dummy opt-125m --prompt-len 16 --gen-len 4 --batch $1 --json"; }
hf_args() { echo "--model opt-125m --prompt-len 16 --gen-len 4 --batch $1 --json"; }
want=$tmp/want
: >"$want"
for b in 1 32; do
	s="sluice bench --backend cpu $(args $b) | CORETYPE=Haswell L2=1048576"
	hf="hf $(hf_args $b) | CORETYPE=Haswell L2=1048576"
	printf '%s\n' "$s" "$hf" "$hf" "$s" >>"$want"
done
if diff -u "$want" "$log" >"$tmp/diff"; then
	ok
else
	bad "runs differ from what was expected (sluice once, HF with the library's defaults, interleaved):"
	cat "$tmp/diff"
fi

# the results: the kernels sluice reported, the ratios, the failed runs
expect_md() {
	if grep -qF -- "$2" "$md"; then ok; else bad "$1: '$2' not in the results"; fi
}
expect_md "sluice's kernels" "- sluice: the environment inherited; CPU kernels (instruction set, GEMM), as its JSON reports them: **avx2 sluice**"
expect_md "inherited env" "OPENBLAS_CORETYPE=Haswell, OPENBLAS_L2_SIZE=1048576"
# sluice is one column: no BLAS word of its own (its GEMM is its own; SLUICE_ARGS chooses another)
expect_md "table header" "| model | batch | HF tok/s | sluice tok/s | sluice / HF | prefill s (HF / sluice) | decode s (HF / sluice) | sluice prefill GEMM GFLOP/s | HF CPU s | load (1 min) |"
expect_md "batch 1 row" "| opt-125m | 1 | 40.00 | 100.00 | 2.50 | 1.500 / 1.000 | 2.500 / 2.000 | 10.0 |"
expect_md "batch 32 row" "| opt-125m | 32 | 40.00 | n/a | n/a |"
expect_md "failed run" "- sluice opt-125m B=32 rep 2: rc=1 sluice: out of memory (stand-in)"
if python3 - "$jsonl" <<'PY'; then ok; else bad "summary records of the .jsonl"; fi
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
s = {r["batch"]: r for r in recs if r["type"] == "summary"}
assert s[1]["ratio_sluice_over_hf"] == {"sluice/hf:inherit": 2.5}, s[1]
assert s[1]["systems"]["sluice"]["kernels"] == ["avx2 sluice"], s[1]
assert s[32]["systems"]["sluice"]["n_ok"] == 0 and s[32]["systems"]["hf:inherit"]["n_ok"] == 2, s[32]
assert sum(r["type"] == "run" for r in recs) == 8
assert all(r["blas"] is None for r in recs if r["type"] == "run" and r["system"] == "sluice")
assert "sluice_blas" not in recs[0]["grid"], recs[0]["grid"]
PY

# SUMMARIZE remakes the same table from the .jsonl
cp "$md" "$tmp/md.first"
if (cd "$root" && SUMMARIZE="$jsonl" PYTHON="$tmp/bin/python" bash bench/cpu_compare.sh) >/dev/null 2>&1 &&
	cmp -s "$md" "$tmp/md.first"; then
	ok
else
	bad "SUMMARIZE does not remake the same table"
fi

# a .jsonl of the script that ran sluice once per OpenBLAS environment: refused, nothing written
mkdir "$tmp/old"
cp "$root/bench/results/cpu-20261203-083256.jsonl" "$tmp/old/"
if ! (cd "$root" && SUMMARIZE="$tmp/old/cpu-20261203-083256.jsonl" PYTHON="$tmp/bin/python" bash bench/cpu_compare.sh) \
	>/dev/null 2>"$tmp/old.err" && grep -q "ran sluice once per OpenBLAS environment (unset, Haswell); its .md holds its table" "$tmp/old.err" &&
	[ ! -e "$tmp/old/cpu-20261203-083256.md" ] && cmp -s "$tmp/old/cpu-20261203-083256.jsonl" "$root/bench/results/cpu-20261203-083256.jsonl"; then
	ok
else
	bad "SUMMARIZE of a two-environment .jsonl: $(cat "$tmp/old.err")"
fi

# a checkpoint folder as the model (bench/llama_cpu_compare.sh): sluice
# --model DIR, HF --checkpoint DIR, once per HF word with its /DTYPE, rows
# labelled with the HF word; PREFIX names the files
mkdir -p "$tmp/ckpt/llama-x" "$tmp/out2"
echo '{}' >"$tmp/ckpt/llama-x/config.json"
: >"$log"
if (cd "$root" && unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE && MODELS="$tmp/ckpt/llama-x" BATCHES=1 P=16 G=4 REPEAT=1 PREFIX=llama-cpu \
	HF_BLAS="inherit/auto inherit/fp32" SLUICE="$tmp/bin/sluice" PYTHON="$tmp/bin/python" \
	OUTDIR="$tmp/out2" bash bench/cpu_compare.sh) >/dev/null 2>"$tmp/stderr2"; then ok; else
	bad "cpu_compare.sh on a checkpoint folder: $(tail -n 3 "$tmp/stderr2")"
fi
env_tail="| CORETYPE=(unset) L2=(unset)"
printf '%s\n' "sluice bench --backend cpu --model $tmp/ckpt/llama-x --prompt-len 16 --gen-len 4 --batch 1 --json $env_tail" \
	"hf --checkpoint $tmp/ckpt/llama-x --prompt-len 16 --gen-len 4 --batch 1 --json --dtype auto $env_tail" \
	"hf --checkpoint $tmp/ckpt/llama-x --prompt-len 16 --gen-len 4 --batch 1 --json --dtype fp32 $env_tail" >"$want"
if diff -u "$want" "$log" >"$tmp/diff"; then ok; else
	bad "checkpoint runs differ from what was expected:"
	cat "$tmp/diff"
fi
md=$(find "$tmp/out2" -name "llama-cpu-*.md" | head -n 1)
if [[ -f $md ]]; then ok; else bad "no llama-cpu-*.md written"; fi
expect_md "row per HF word" "| llama-x (HF inherit/auto) | 1 | 40.00 | 100.00 | 2.50 |"
expect_md "row per HF word" "| llama-x (HF inherit/fp32) | 1 | 40.00 | 100.00 | 2.50 |"

echo "test_bench_compare: $passes passed, $fails failed"
((fails == 0))
