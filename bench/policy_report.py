#!/usr/bin/env python3
"""The report of bench/policy_validate.sh: predicted against measured.

usage: policy_report.py RESULTS.jsonl OUT_PREFIX [--machine S] [--cmd S] [--wall SECONDS]
       policy_report.py RESULTS.jsonl --best-grid MODEL WORKLOAD BUDGET
         (the name of the best measured dense grid policy that fits BUDGET,
         or nothing: policy_validate.sh runs it again beside the search's)

Reads the rows the script wrote (one "profile" row, then bench --json
objects of kind "grid", "auto", "beside", "fastest" and "flexgen") and writes
OUT_PREFIX.md: the machine and the command, the grid's table (policy, budget,
predicted and measured tokens/s, error), the median and 90th percentile of
the absolute error, the search's regret, and where the search's margin took
a simpler policy than the fastest prediction, the two measured side by side;
and the log-log scatter of predicted
against measured tokens/s with y = x as OUT_PREFIX.svg and OUT_PREFIX.png.
The plot needs matplotlib (python3 -m venv build-venv &&
build-venv/bin/pip install matplotlib; run with build-venv/bin/python);
without it a plain SVG is written and no PNG.

Error of a run: |predicted - measured| / measured (tokens/s).  The 90th
percentile is the nearest-rank one.
"""
import argparse
import json
import math
import os

ap = argparse.ArgumentParser()
ap.add_argument("results")
ap.add_argument("out", nargs="?")
ap.add_argument("--machine", default="?")
ap.add_argument("--cmd", default="?")
ap.add_argument("--wall", default="?")
ap.add_argument("--best-grid", nargs=3, metavar=("MODEL", "WORKLOAD", "BUDGET"))
a = ap.parse_args()
if not a.out and not a.best_grid:
    ap.error("OUT_PREFIX is required (or --best-grid)")
rows = [json.loads(l) for l in open(a.results) if l.strip()]
prof = next((r for r in rows if r.get("kind") == "profile"), None)
runs = [r for r in rows if r.get("kind") in ("grid", "auto", "beside", "fastest", "flexgen")]
grid = [r for r in runs if r["kind"] == "grid"]


def budget_bytes(s):
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return float(s[:-1]) * mult[s[-1]] if s and s[-1] in mult else float(s)


def best_grid(model, workload, budget):
    """The best measured dense grid run that fits budget (admitted at it or
    a smaller one), or None."""
    fits = [g for g in grid if (g["model"], g["workload"]) == (model, workload) and g["hh_ratio"] == 0
            and budget_bytes(g["budget"]) <= budget_bytes(budget)]
    return max(fits, key=lambda g: g["throughput_tok_s"], default=None)


if a.best_grid:
    b = best_grid(*a.best_grid)
    print(b["policy"] if b else "")
    raise SystemExit(0)


def err(r):
    p, m = r.get("predicted_throughput_tok_s"), r["throughput_tok_s"]
    return abs(p - m) / m if p is not None and m > 0 else None


def pct(xs, q):
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def flags(r):
    """The policy of a run as the flags that give it."""
    f = (f"{r.get('gpu_batch_size', '?')}x{r.get('num_gpu_batches', '?')}; --percent "
         + " ".join(f"{r[k]:g}" for k in ("w_gpu_percent", "w_cpu_percent", "cache_gpu_percent",
                                            "cache_cpu_percent", "act_gpu_percent", "act_cpu_percent")))
    if not r["overlap"]:
        f += " --no-overlap"
    if not r["sep_layer"]:
        f += " sep_layer off"
    if r["cpu_cache_compute"]:
        f += " --cpu-cache-compute"
    if r["hh_ratio"] > 0:
        f += f" H2O {r['hh_ratio'] + r['recent_ratio']:.0%}"
    return f


md = []
md.append("# The cost model against measurement (CPU backend)\n")
md.append(f"- machine: {a.machine}")
md.append(f"- command: `{a.cmd}`; wall time {a.wall} s")
if prof:
    rates = ", ".join(f"{k} {prof[k]:.3g}" for k in ("mem_read_gbps", "cpu_gemm_gflops", "copy_gbps",
                                                      "attn_decode_gbps", "disk_read_gbps", "disk_write_gbps", "disk_read_spread",
                                                      "disk_page_write_gbps", "disk_overlap", "copy_overlap", "load_average")
                      if isinstance(prof.get(k), (int, float)))
    seg = prof.get("disk_segment_read")
    if isinstance(seg, dict):
        rates += "; disk segment reads " + ", ".join(f"{b / 2**20:g} MiB {g:.3g}" for b, g in zip(seg["bytes"], seg["gbps"]))
    cache = [f"{k} {prof[k] / 2**20:g} MiB" for k in ("llc_bytes", "llc_hot_bytes") if isinstance(prof.get(k), int)]
    if cache:
        rates += "; the cache: " + ", ".join(cache)
    if isinstance(prof.get("fit_prefill"), (int, float)):
        rates += (f"; fitted (`--fit`, {prof.get('fit_model')} on the device): compute x {prof['fit_prefill']:.3f} "
                  f"in the prefill, x {prof['fit_decode']:.3f} in the decode")
    else:
        rates += "; not fitted (the rates alone)"
    md.append(f"- profile (measured once at the start, used for every prediction): backend "
              f"{prof.get('backend')}, {prof.get('threads')} threads, build {prof.get('build', '?')}; {rates}")
reps = [len(r.get("repeat_tok_s") or [1]) for r in runs]
spreads = [(max(x) - min(x)) / median(x) for x in (r.get("repeat_tok_s") for r in runs) if x and len(x) > 1]
nrep = max(reps, default=1)
md.append(f"- each policy: `sluice bench --json --profile P`, after bench's warm-up, "
          f"{'once' if nrep == 1 else f'{nrep} times, the run of median tokens/s kept'}; "
          "error = |predicted - measured| / measured tokens/s")
if spreads:
    md.append(f"- spread of a policy's {nrep} runs ((max - min) / median tokens/s): median "
              f"{median(spreads):.1%}, 90th percentile {pct(spreads, 90):.1%}, largest {max(spreads):.1%}")
md.append("")

errs = [e for e in (err(r) for r in grid) if e is not None]
if errs:
    md.append(f"**Grid: {len(errs)} runs; median absolute error {median(errs):.1%}, 90th percentile "
              f"{pct(errs, 90):.1%}** (targets: 10% and 20%).\n")
    for model in sorted({r["model"] for r in grid}):
        e = [err(r) for r in grid if r["model"] == model and err(r) is not None]
        md.append(f"- {model}: {len(e)} runs, median {median(e):.1%}, 90th percentile {pct(e, 90):.1%}")
    md.append("")
md.append("| model | workload | policy | placement | --gpu-mem | predicted tok/s | measured tok/s | runs tok/s | error | "
          "predicted prefill s / decode s | measured prefill s / decode s | bottleneck (prefill, decode) |")
md.append("|---|---|---|---|---|---:|---:|---|---:|---|---|---|")
for r in grid:
    e = err(r)
    p = r.get("predicted_throughput_tok_s")
    md.append(f"| {r['model']} | {r['workload']} | {r['policy']} | {flags(r)} | {r['budget']} | "
              f"{p if p is None else f'{p:.2f}'} | {r['throughput_tok_s']:.2f} | "
              f"{' '.join(f'{x:.1f}' for x in r.get('repeat_tok_s') or [])} | "
              f"{'-' if e is None else f'{e:.1%}'} | "
              f"{r.get('predicted_prefill_s') or 0:.2f} / {r.get('predicted_decode_s') or 0:.2f} | "
              f"{r['prefill_s']:.2f} / {r['decode_s']:.2f} | "
              f"{r.get('predicted_prefill_bottleneck')}, {r.get('predicted_decode_bottleneck')} |")

# search quality
md.append("\n## Search quality\n")
md.append("For each model, workload and device budget: the search's choice (`--policy auto`, blocks "
          "capped at the grid's), measured; the best measured dense grid policy that fits the budget "
          "(admitted at it or a smaller one); the default policy (everything on the device); a "
          "FlexGen-style policy (the most weights on the device that fit, in 10% steps, the rest of "
          "the weights, the cache and the activations on the host, cpu_cache_compute, several "
          "micro-batches).  Regret = 1 - choice / best grid (negative: the choice beat the grid), "
          "with the best grid policy's run right after the choice's where there is one (\"again\": the "
          "grid's own run was up to half an hour earlier, on a machine whose rate moves by 10 to 20% "
          "in that time); the regret against the grid's own run beside it.\n")
md.append("| model | workload | --gpu-mem | search's choice | predicted | measured | best grid (dense, fits) | "
          "again, right after | regret | regret against the grid's run | default | FlexGen-style |")
md.append("|---|---|---|---|---:|---:|---|---:|---:|---:|---|---|")
regrets, regrets_grid = [], []
for r in [r for r in runs if r["kind"] == "auto"]:
    key = (r["model"], r["workload"])
    b = budget_bytes(r["budget"])
    best = best_grid(r["model"], r["workload"], r["budget"])
    dev = next((g for g in grid if (g["model"], g["workload"]) == key and g["policy"] == "dev"), None)
    dflt = ("does not fit" if dev is None or budget_bytes(dev["budget"]) > b
            else f"{dev['throughput_tok_s']:.2f}")
    fg = next((f for f in runs if f["kind"] == "flexgen" and (f["model"], f["workload"]) == key
               and f["budget"] == r["budget"]), None)
    fgs = "does not fit" if fg is None else f"{fg['throughput_tok_s']:.2f} ({fg['policy']})"
    again = next((x for x in runs if x["kind"] == "beside" and (x["model"], x["workload"]) == key
                  and x["budget"] == r["budget"]), None)
    reg = reg_grid = None
    if best:
        reg_grid = 1 - r["throughput_tok_s"] / best["throughput_tok_s"]
        regrets_grid.append(reg_grid)
        ref = again if again and again["policy"] == best["policy"] else best
        reg = 1 - r["throughput_tok_s"] / ref["throughput_tok_s"]
        regrets.append(reg)
    p = r.get("predicted_throughput_tok_s")
    best_s = "-" if not best else f"{best['policy']} {best['throughput_tok_s']:.2f}"
    again_s = "-" if not again else f"{again['throughput_tok_s']:.2f}"
    md.append(f"| {r['model']} | {r['workload']} | {r['budget']} | {flags(r)} | "
              f"{p if p is None else f'{p:.2f}'} | {r['throughput_tok_s']:.2f} | "
              f"{best_s} | {again_s} | "
              f"{'-' if reg is None else f'{reg:+.1%}'} | {'-' if reg_grid is None else f'{reg_grid:+.1%}'} | "
              f"{dflt} | {fgs} |")
if regrets:
    md.append(f"\nRegret: median {median(regrets):+.1%}, worst {max(regrets):+.1%} over {len(regrets)} "
              f"(model, workload, budget) (target: at most 5%); against the grid's own runs: median "
              f"{median(regrets_grid):+.1%}, worst {max(regrets_grid):+.1%}.")

# the margin: the choice against the fastest prediction, run right after it
pairs = [(r, f) for r in runs if r["kind"] == "auto"
         for f in runs if f["kind"] == "fastest" and (f["model"], f["workload"], f["budget"])
         == (r["model"], r["workload"], r["budget"])]
if pairs:
    md.append("\n## The margin\n")
    md.append("Where the search's margin (1%: of the candidates the fastest prediction leads by at "
              "most 1%, the simplest) took another policy than the fastest prediction, the fastest "
              "(`--policy auto --margin 0`) measured right after the choice.  Ratio = the choice's "
              "measured tokens/s over the fastest's (above 1: the margin gained).\n")
    md.append("| model | workload | --gpu-mem | choice | predicted | measured | fastest prediction "
              "| predicted | measured | ratio |")
    md.append("|---|---|---|---|---:|---:|---|---:|---:|---:|")
    ratios = []
    for r, f in pairs:
        ratio = r["throughput_tok_s"] / f["throughput_tok_s"]
        ratios.append(ratio)
        md.append(f"| {r['model']} | {r['workload']} | {r['budget']} | {flags(r)} | "
                  f"{r.get('predicted_throughput_tok_s') or 0:.2f} | {r['throughput_tok_s']:.2f} | "
                  f"{flags(f)} | {f.get('predicted_throughput_tok_s') or 0:.2f} | "
                  f"{f['throughput_tok_s']:.2f} | {ratio:.3f} |")
    md.append(f"\nThe choice over the fastest prediction, measured: median {median(ratios):.3f}, "
              f"from {min(ratios):.3f} to {max(ratios):.3f} over {len(ratios)}.")

# the scatter
svg = a.out + ".svg"
pts = [(r["model"], r["workload"], r["kind"], r["predicted_throughput_tok_s"], r["throughput_tok_s"])
       for r in runs if r.get("predicted_throughput_tok_s") and r["throughput_tok_s"] > 0 and r["kind"] not in ("beside", "fastest")]
plotnote = "no run had a prediction: no plot"
if pts:
    lo = min(min(p[3], p[4]) for p in pts) / 1.3
    hi = max(max(p[3], p[4]) for p in pts) * 1.3
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 6))
        colors = {"opt-125m": "tab:blue", "opt-1.3b": "tab:red"}
        markers = {}
        for m, wl, kind, p, y in pts:
            mk = markers.setdefault(wl, "os^v"[len(markers) % 4])
            if kind != "grid":
                mk = "*" if kind == "auto" else "P"
            ax.scatter(p, y, c=colors.get(m, "tab:gray"), marker=mk, s=28 if kind == "grid" else 90,
                       edgecolors="k" if kind != "grid" else "none", linewidths=0.6,
                       label=f"{m} {wl}" if kind == "grid" else f"{m} {'search' if kind == 'auto' else 'FlexGen-style'}")
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
        for f in (0.8, 1.2):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("predicted tokens/s (cost model)")
        ax.set_ylabel("measured tokens/s (sluice bench)")
        ax.set_title("sluice: predicted against measured (dotted: ±20%)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        h, l = ax.get_legend_handles_labels()
        seen = {}
        for hh, ll in zip(h, l):
            seen.setdefault(ll, hh)
        ax.legend(seen.values(), seen.keys(), fontsize=7)
        fig.tight_layout()
        fig.savefig(svg)
        fig.savefig(a.out + ".png", dpi=110)
        plotnote = (f"![predicted against measured]({os.path.basename(svg)}) "
                    f"(also `{os.path.basename(a.out)}.png`; matplotlib)")
    except ImportError:
        W = H = 480
        M = 50
        X = lambda v: M + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (W - 2 * M)
        Y = lambda v: H - M - (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (H - 2 * M)
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="10">',
                 f'<rect x="{M}" y="{M}" width="{W - 2 * M}" height="{H - 2 * M}" fill="none" stroke="#999"/>',
                 f'<line x1="{X(lo):.1f}" y1="{Y(lo):.1f}" x2="{X(hi):.1f}" y2="{Y(hi):.1f}" stroke="black" stroke-dasharray="5,3"/>',
                 f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">predicted tokens/s (log)</text>',
                 f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">measured tokens/s (log)</text>']
        for v in sorted({round(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / 4), 1) for i in range(5)}):
            parts.append(f'<text x="{X(v):.1f}" y="{H - M + 14}" text-anchor="middle">{v:g}</text>')
            parts.append(f'<text x="{M - 4}" y="{Y(v):.1f}" text-anchor="end">{v:g}</text>')
        for m, wl, kind, p, y in pts:
            col = "#1f77b4" if m == "opt-125m" else "#d62728"
            parts.append(f'<circle cx="{X(p):.1f}" cy="{Y(y):.1f}" r="{3 if kind == "grid" else 5}" fill="{col}" fill-opacity="0.7"/>')
        parts.append("</svg>")
        open(svg, "w").write("\n".join(parts) + "\n")
        plotnote = (f"![predicted against measured]({os.path.basename(svg)}) (a plain SVG: matplotlib "
                    f"was not importable, so no PNG)")
md.insert(5, plotnote + "\n")
with open(a.out + ".md", "w") as f:
    f.write("\n".join(md) + "\n")
print(open(a.out + ".md").read())
