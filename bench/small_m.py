#!/usr/bin/env python3
"""Builds of sluice side by side on decode-sized products (few rows).

For each round, alternating the builds:
  - kernel: each build's cpu_gemm_bench on opt-125m's and opt-1.3b's shapes
    at the given row counts (GFLOP/s, median of --reps inside a run);
  - decode: each build's `sluice bench --dummy MODEL --backend cpu` at each
    batch (decode seconds, tokens/s, the GEMMs' weight GB/s).
Prints the medians over the rounds and each build's ratio to the first,
and writes bench/results/small-m-<UTC date-time>.{jsonl,md}.

Usage: bench/small_m.py NAME=SLUICE[:GEMM_BENCH] ... [--rounds 3]
         [--rows 1,2,...,8] [--batches 1,2,4,8] [--models opt-125m]
         [--prompt-len 64] [--gen-len 64] [--reps 20]
A build without its cpu_gemm_bench takes part in the decode runs only.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"small_m: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    lines = [l for l in p.stdout.splitlines() if l.strip().startswith("{")]
    if not lines:
        sys.exit(f"small_m: {' '.join(cmd)} printed no JSON")
    return json.loads(lines[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+", help="NAME=SLUICE[:GEMM_BENCH]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--models", default="opt-125m")
    ap.add_argument("--kernel-models", default="opt-125m,opt-1.3b")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    builds = []
    for b in args.builds:
        name, _, paths = b.partition("=")
        exe, _, gb = paths.partition(":")
        if not name or not exe:
            sys.exit(f"small_m: '{b}' is not NAME=SLUICE[:GEMM_BENCH]")
        builds.append((name, exe, gb or None))
    batches = [int(x) for x in args.batches.split(",") if x]
    models = [m for m in args.models.split(",") if m]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    os.makedirs("bench/results", exist_ok=True)
    out = f"bench/results/small-m-{stamp}"
    kern = {}  # (build, model, m, n, k) -> [GFLOP/s]
    dec = {}  # (build, model, batch) -> [record]
    with open(out + ".jsonl", "w") as jl:
        for r in range(args.rounds):
            for name, exe, gb in builds:
                if not gb:
                    continue
                j = run_json([gb, "--json", "--no-blas", "--rows", args.rows, "--models",
                              args.kernel_models, "--reps", str(args.reps)])
                for c in j["rows"]:
                    key = (name, c["model"], c["m"], c["n"], c["k"])
                    kern.setdefault(key, []).append(c["sluice_gflops"])
                    jl.write(json.dumps({"round": r, "build": name, "kind": "kernel", **c}) + "\n")
            for model in models:
                for bt in batches:
                    for name, exe, gb in builds:
                        d = run_json([exe, "bench", "--dummy", model, "--backend", "cpu",
                                      "--prompt-len", str(args.prompt_len), "--gen-len",
                                      str(args.gen_len), "--batch", str(bt), "--json"])
                        rec = {k: d.get(k) for k in ("decode_s", "prefill_s", "throughput_tok_s",
                                                     "decode_gemm_weight_gbps")}
                        dec.setdefault((name, model, bt), []).append(rec)
                        jl.write(json.dumps({"round": r, "build": name, "kind": "decode",
                                             "model": model, "batch": bt, **rec}) + "\n")
                        jl.flush()
    med = statistics.median
    names = [b[0] for b in builds]
    lines = [f"# Decode-sized products, builds side by side ({stamp} UTC)", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} CPUs. Rounds: {args.rounds}, "
             "the builds alternating within each round; medians over the rounds.", "",
             "Command: `python3 bench/small_m.py " + " ".join(sys.argv[1:]) + "`", ""]
    if kern:
        kn = [n for n, _, g in builds if g]
        lines += ["## Kernel: cpu_gemm_bench, GFLOP/s (2 m n k per product)", "",
                  "| shape (n x k) | m | " + " | ".join(kn) + " | " +
                  " | ".join(f"{n}/{kn[0]}" for n in kn[1:]) + " |",
                  "|---|---:|" + "---:|" * (2 * len(kn) - 1)]
        shapes = sorted({k[1:] for k in kern}, key=lambda s: (s[0], s[2], s[3], s[1]))
        for model, m, n, k in shapes:
            v = [med(kern[(b, model, m, n, k)]) for b in kn]
            lines.append(f"| {model} {n} x {k} | {m} | " + " | ".join(f"{x:.1f}" for x in v) +
                         " | " + " | ".join(f"{x / v[0]:.2f}" for x in v[1:]) + " |")
        lines.append("")
    lines += [f"## Decode: `sluice bench --dummy MODEL --backend cpu --prompt-len {args.prompt_len} "
              f"--gen-len {args.gen_len} --batch B`", "",
              "ms per decode step (median) and tokens/s; ratio = first build's step time / "
              "this build's.", "",
              "| model | batch | " + " | ".join(f"{n} ms/step" for n in names) + " | " +
              " | ".join(f"{n} tok/s" for n in names) + " | " +
              " | ".join(f"{n} speed-up" for n in names[1:]) + " |",
              "|---|---:|" + "---:|" * (3 * len(names) - 1)]
    for model in models:
        for bt in batches:
            ms = [med([x["decode_s"] for x in dec[(n, model, bt)]]) * 1e3 / (args.gen_len - 1)
                  for n in names]
            tp = [med([x["throughput_tok_s"] for x in dec[(n, model, bt)]]) for n in names]
            lines.append(f"| {model} | {bt} | " + " | ".join(f"{x:.2f}" for x in ms) + " | " +
                         " | ".join(f"{x:.1f}" for x in tp) + " | " +
                         " | ".join(f"{ms[0] / x:.2f}x" for x in ms[1:]) + " |")
    lines.append("")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}.md and {out}.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
