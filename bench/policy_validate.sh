#!/usr/bin/env bash
# The cost model against measurement, and the policy search against the
# policies a person would pick (issue 13's validation), on the CPU backend.
#
# 1. One profile of this machine (`sluice profile --offload-dir`, with
#    `--dummy` of every model measured, so that its GEMM rates include
#    each model's own shapes, and `--fit`: short jobs of dummy opt-350m,
#    a model outside the grid, whose measured over predicted compute
#    scales the model's), used for every run.
# 2. A grid of policies spanning every placement (weights on the device,
#    the host, the disk and split; the KV cache on the device, the host,
#    the disk and split; cpu_cache_compute; activations on the host; H2O at
#    10% and 20% of the prompt; 1 to 8 micro-batches; overlap on and off):
#    14 for dummy opt-125m (blocks of 8) and 4 for opt-1.3b (blocks of 2;
#    its weights half on disk, not all), each on two workloads (prompt 256
#    gen 32, prompt 64 gen 128; opt-1.3b's second: gen 64): 36 runs, sized
#    so the whole script takes about 25 minutes on a 2-core machine.  Each runs as `sluice bench --json --profile P`: the
#    prediction and the measurement in one output.  A policy runs under the
#    smallest of the model's device budgets (--gpu-mem; opt-125m 224M,
#    320M, 1G; opt-1.3b 640M, 1536M, 4G) that admits it, so all but the
#    all-device runs are forced off the device.
# 3. Search quality: for each model, workload and the budgets that force
#    offloading (opt-125m: 224M and 320M; opt-1.3b: 640M),
#    the search's choice (`sluice bench --policy auto` with the same budget,
#    the offload folder as the disk tier, blocks capped at the grid's),
#    measured, and where its margin took a simpler policy than the fastest
#    prediction, the fastest (`--margin 0`) right after it (kind "fastest"); against the best measured dense grid policy that fits the
#    same budget (one admitted at that budget or a smaller one), measured
#    again right after the choice (kind "beside": the grid ran it up to
#    half an hour earlier, and this machine's rate moves by 10 to 20% in
#    that time, so the regret compares runs minutes apart), the
#    default policy (everything on the device: it fits only the largest
#    budget) and a FlexGen-style policy for the budget (FlexGen's published
#    OPT-30B/175B shape: as many weights on the device as fit, in steps of
#    10%, the rest of the weights, the cache and the activations on the host,
#    cpu_cache_compute, several micro-batches).  cpu_cache_compute is
#    meaningful on the CPU backend: host-tier attention runs in place over
#    the cache's home copy instead of copying it to the device tier.
#
# Environment (defaults): SLUICE=build/sluice OFFLOAD=/tmp/sluice-policy-validate
#   MODELS="opt-125m opt-1.3b" THREADS=(all cores) PY=python3
#   REPEAT=3: runs of each policy, the median's recorded (odd: a real run)
#   REPEAT_BIG=(REPEAT): the same for opt-1.3b, whose runs take minutes
# The runs take every core: on a shared machine run the script at a higher
# priority than the rest (e.g. nice -n -10, others at nice 19), and read the
# load averages and the spread of each policy's runs in the report.
#   TINY=1: opt-125m, two policies, short workloads, one budget (a check
#   that the script works, in about a minute).
#   ONLY="w-disk c-disk ...": only these grid policies (default: all)
#   SEARCH=0: leave out the search quality part (3.)
#   FIT=0: the profile without --fit (the rates alone)
# The plot needs matplotlib (without it the report writes a plain SVG and no
# PNG):  python3 -m venv build-venv && build-venv/bin/pip install matplotlib
#        PY=build-venv/bin/python bench/policy_validate.sh
# Writes bench/results/policy-validate-<UTC date-time>.{jsonl,md,svg,png}.
set -euo pipefail
cd "$(dirname "$0")/.."
SLUICE=${SLUICE:-build/sluice}
OFFLOAD=${OFFLOAD:-/tmp/sluice-policy-validate}
MODELS=${MODELS:-opt-125m opt-1.3b}
PY=${PY:-python3}
TINY=${TINY:-0}
THREADS=${THREADS:-}
REPEAT=${REPEAT:-3}
REPEAT_BIG=${REPEAT_BIG:-$REPEAT}
ONLY=${ONLY:-}
SEARCH=${SEARCH:-1}
FIT=${FIT:-1}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/results/policy-validate-$stamp
work=$(mktemp -d)
trap 'rm -rf "$work" "$OFFLOAD/pv-store"' EXIT
mkdir -p "$OFFLOAD/pv-store" bench/results
: >"$out.jsonl"
t_start=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
common=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$SLUICE")
thr=()
[[ -n $THREADS ]] && thr=(--threads "$THREADS")

((TINY)) && MODELS=opt-125m
# the two workloads, "prompt gen"; opt-1.3b's second generates 64 tokens,
# not 128: with its weights on disk each decode step reads them all
workloads() {
	if ((TINY)); then echo "32 8,16 16"; elif [[ $1 == opt-125m ]]; then echo "256 32,64 128"; else echo "256 32,64 64"; fi
}

block() { [[ $1 == opt-125m ]] && { ((TINY)) && echo 4 || echo 8; } || echo 2; }
levels() { [[ $1 == opt-125m ]] && echo "224M 320M 1G" || echo "640M 1536M 4G"; }

# The grid: which models (all, or 125m only), a name, micro-batches per
# block, and the policy's other fields.
grid() {
	if ((TINY)); then
		cat <<'EOF'
all	w-host	1	"w_gpu_percent": 0, "w_cpu_percent": 100
all	c-host-ccc	2	"w_gpu_percent": 0, "w_cpu_percent": 100, "cache_gpu_percent": 0, "cache_cpu_percent": 100, "cpu_cache_compute": true
EOF
		return
	fi
	cat <<'EOF'
125m	dev	1	"w_gpu_percent": 100
all	w-host	1	"w_gpu_percent": 0, "w_cpu_percent": 100
125m	w-host-mb2	2	"w_gpu_percent": 0, "w_cpu_percent": 100
125m	w-host-mb8	8	"w_gpu_percent": 0, "w_cpu_percent": 100
125m	w-host-noovl	1	"w_gpu_percent": 0, "w_cpu_percent": 100, "overlap": false
125m	w-half	1	"w_gpu_percent": 50, "w_cpu_percent": 50
125m	w-disk	1	"w_gpu_percent": 0, "w_cpu_percent": 0
1.3b	w-disk-half	1	"w_gpu_percent": 0, "w_cpu_percent": 50
125m	w-split	2	"w_gpu_percent": 20, "w_cpu_percent": 40
all	c-host-ccc	2	"w_gpu_percent": 0, "w_cpu_percent": 100, "cache_gpu_percent": 0, "cache_cpu_percent": 100, "cpu_cache_compute": true
125m	c-disk	1	"w_gpu_percent": 0, "w_cpu_percent": 100, "cache_gpu_percent": 0, "cache_cpu_percent": 0
125m	c-split	2	"w_gpu_percent": 0, "w_cpu_percent": 100, "cache_gpu_percent": 50, "cache_cpu_percent": 25
125m	act-host-ccc	4	"w_gpu_percent": 0, "w_cpu_percent": 100, "cache_gpu_percent": 0, "cache_cpu_percent": 100, "act_gpu_percent": 0, "act_cpu_percent": 100, "cpu_cache_compute": true
125m	h2o-10	1	"w_gpu_percent": 0, "w_cpu_percent": 100, "hh_ratio": 0.05
all	h2o-20	2	"w_gpu_percent": 0, "w_cpu_percent": 100, "cache_gpu_percent": 0, "cache_cpu_percent": 100, "hh_ratio": 0.1
EOF
}

# record KIND MODEL P G NAME BUDGET CMD_STRING: the bench JSON of stdin as
# one row, with what it was
record() {
	"$PY" -c '
import json, sys
d = json.loads(sys.stdin.read())
d.update(kind=sys.argv[1], model=sys.argv[2], workload="p%s-g%s" % (sys.argv[3], sys.argv[4]),
         policy=sys.argv[5], budget=sys.argv[6], cmd=sys.argv[7])
print(json.dumps(d))' "$@" >>"$out.jsonl"
}

# bench_at KIND MODEL P G NAME BUDGET ARGS...: REPEAT runs under --gpu-mem
# BUDGET, the one of median tokens/s recorded (with every run's tokens/s);
# 0 done, 2 refused before it ran (does not fit), else failed
bench_at() {
	local kind=$1 model=$2 p=$3 g=$4 name=$5 budget=$6
	shift 6
	local cmd=("${common[@]}" bench --backend cpu "${thr[@]}" --dummy "$model" --prompt-len "$p"
		--gen-len "$g" --offload-dir "$OFFLOAD/pv-store" --profile "$work/profile.json"
		--gpu-mem "$budget" --json "$@")
	local rc=0 r n=$REPEAT
	[[ $model == opt-125m ]] || n=$REPEAT_BIG
	rm -f "$work"/rep.*.json
	for ((r = 1; r <= n; r++)); do
		"${cmd[@]}" >"$work/rep.$r.json" 2>"$work/run.err" || rc=$?
		((rc == 0)) || break
	done
	if ((rc == 0)); then
		"$PY" -c '
import json, sys
runs = [json.load(open(f)) for f in sys.argv[1:]]
order = sorted(runs, key=lambda d: d["throughput_tok_s"])
med = dict(order[(len(order) - 1) // 2])
med["repeat_tok_s"] = [d["throughput_tok_s"] for d in runs]
print(json.dumps(med, separators=(",", ":")))' "$work"/rep.*.json >"$work/run.json"
		echo "  $kind $model p$p g$g $name --gpu-mem $budget: $(grep -o '"throughput_tok_s":[0-9.]*' "$work/run.json")" \
			"$(grep -o '"predicted_throughput_tok_s":[0-9.]*' "$work/run.json")" >&2
		record "$kind" "$model" "$p" "$g" "$name" "$budget" "${cmd[*]}" <"$work/run.json"
	elif ((rc != 2)); then
		echo "  $kind $model p$p g$g $name --gpu-mem $budget: FAILED (exit $rc): $(cat "$work/run.err")" >&2
	fi
	return $rc
}

# The profile every prediction uses, with the models' own GEMM shapes.
shapes=()
for model in $MODELS; do shapes+=(--dummy "$model"); done
((FIT)) && shapes+=(--fit)
echo "+ sluice profile --offload-dir $OFFLOAD/pv-store ${shapes[*]}" >&2
"${common[@]}" profile --backend cpu "${thr[@]}" --offload-dir "$OFFLOAD/pv-store" "${shapes[@]}" \
	--json "$work/profile.json" >&2
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); d["kind"] = "profile"; print(json.dumps(d))' \
	"$work/profile.json" >>"$out.jsonl"

# 2. the grid
for model in $MODELS; do
	B=$(block "$model")
	read -r -a lv <<<"$(levels "$model")"
	((TINY)) && lv=("${lv[@]:0:1}" "${lv[2]}")
	IFS=, read -r -a workloads <<<"$(workloads "$model")"
	while IFS=$'\t' read -r which name ngb fields; do
		[[ $which == all || $model == opt-$which ]] || continue
		[[ -z $ONLY || " $ONLY " == *" $name "* ]] || continue
		((ngb <= B)) || continue
		printf '{"gpu_batch_size": %d, "num_gpu_batches": %d, %s}\n' $((B / ngb)) "$ngb" "$fields" \
			>"$work/$model-$name.json"
		for w in "${workloads[@]}"; do
			read -r p g <<<"$w"
			fit=0
			for b in "${lv[@]}"; do
				rc=0
				bench_at grid "$model" "$p" "$g" "$name" "$b" --policy "$work/$model-$name.json" || rc=$?
				if ((rc != 2)); then fit=1; break; fi
			done
			((fit)) || echo "  grid $model p$p g$g $name: fits none of ${lv[*]}: $(cat "$work/run.err")" >&2
		done
	done < <(grid)
done

# 3. search quality: the search's choice and a FlexGen-style policy, per
# model, workload and the budgets that force offloading
((SEARCH)) || MODELS_SEARCH=
for model in ${MODELS_SEARCH-$MODELS}; do
	B=$(block "$model")
	read -r -a lv <<<"$(levels "$model")"
	budgets=("${lv[@]:0:2}")
	# opt-1.3b: the smaller budget only (its runs take minutes)
	[[ $model == opt-125m ]] || budgets=("${lv[0]}")
	((TINY)) && budgets=("${lv[0]}")
	ngb=$((B >= 4 ? 4 : B))
	IFS=, read -r -a workloads <<<"$(workloads "$model")"
	for w in "${workloads[@]}"; do
		read -r p g <<<"$w"
		for b in "${budgets[@]}"; do
			bench_at auto "$model" "$p" "$g" auto "$b" --policy auto --batch "$B" ||
				echo "  auto $model p$p g$g --gpu-mem $b: $(cat "$work/run.err")" >&2
			grep -h "^sluice: policy auto" "$work/run.err" >&2 || true
			# where the margin took a simpler policy than the fastest
			# prediction, the fastest too, right after (kind "fastest")
			if grep -q "^sluice: policy auto: the fastest prediction" "$work/run.err"; then
				bench_at fastest "$model" "$p" "$g" fastest "$b" --policy auto --margin 0 --batch "$B" ||
					echo "  fastest $model p$p g$g --gpu-mem $b: $(cat "$work/run.err")" >&2
			fi
			# the best dense grid policy that fits this budget, again
			best=$("$PY" bench/policy_report.py "$out.jsonl" --best-grid "$model" "p$p-g$g" "$b")
			if [[ -n $best ]]; then
				bench_at beside "$model" "$p" "$g" "$best" "$b" --policy "$work/$model-$best.json" ||
					echo "  beside $model p$p g$g $best --gpu-mem $b: $(cat "$work/run.err")" >&2
			fi
			for wg in 100 90 80 70 60 50 40 30 20 10 0; do
				rc=0
				bench_at flexgen "$model" "$p" "$g" "flexgen-w$wg" "$b" --gpu-batch-size $((B / ngb)) \
					--num-gpu-batches "$ngb" --percent "$wg" $((100 - wg)) 0 100 0 100 --cpu-cache-compute || rc=$?
				((rc == 2)) || break
			done
		done
	done
done

t_end=$(date +%s)
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
"$PY" bench/policy_report.py "$out.jsonl" "$out" \
	--machine "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB; load average $load_start at the start, $load_end at the end" \
	--cmd "$(basename "$0") (SLUICE=$SLUICE MODELS='$MODELS' TINY=$TINY REPEAT=$REPEAT REPEAT_BIG=$REPEAT_BIG ONLY='$ONLY' SEARCH=$SEARCH FIT=$FIT OFFLOAD=$OFFLOAD; nice $(nice))" \
	--wall $((t_end - t_start))
echo "wrote $out.jsonl, $out.md and the plot" >&2
