#!/usr/bin/env python3
"""Tables, plot and reading for bench/h2o_quality.sh.

usage: h2o_report.py RESULTS.jsonl OUT_PREFIX [--machine S] [--sluice S]
                     [--wall SECONDS] [--env S]
Writes OUT_PREFIX.md and OUT_PREFIX.svg (matplotlib when importable, else a
plain hand-written SVG).  Confidence intervals: paired bootstrap over the
lines of a set (2000 resamples, seed 0) of the ratio of two perplexities.
"""
import argparse
import json
import math
import os
import random

ap = argparse.ArgumentParser()
ap.add_argument("results")
ap.add_argument("out")
ap.add_argument("--machine", default="?")
ap.add_argument("--sluice", default="?")
ap.add_argument("--wall", default="?")
ap.add_argument("--env", default="")
a = ap.parse_args()
rows = [json.loads(l) for l in open(a.results) if l.strip()]
MAIN = rows[0]["model"]
SHARES = (0, 25, 50, 75, 100)
BUDGETS = (5, 10, 20, 40)


def find(model=MAIN, engine=None, **kw):
    for r in rows:
        if r["model"] != model or r.get("engine") != engine:
            continue
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def ratio_ci(x, y, n=2000):
    """ppl(x) / ppl(y) and its 95% paired-bootstrap interval over lines."""
    lx, ly, nt = x["line_sum_logprob"], y["line_sum_logprob"], x["line_tokens"]
    assert nt == y["line_tokens"]
    f = lambda idx: math.exp((sum(ly[i] for i in idx) - sum(lx[i] for i in idx)) / sum(nt[i] for i in idx))
    m = len(lx)
    rnd = random.Random(0)
    bs = sorted(f([rnd.randrange(m) for _ in range(m)]) for _ in range(n))
    return f(range(m)), bs[int(0.025 * n)], bs[int(0.975 * n) - 1]


def fmt_ci(t):
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


def ppl(r):
    return f"{r['perplexity']:.2f}" if r else "–"


md = []
w = md.append
w("# H2O quality on the bundled model: perplexity against the KV budget\n")
try:
    cfg = json.load(open(os.path.join(MAIN, "config.json")))
    shape = f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads, hidden {cfg['hidden_size']}"
except (OSError, KeyError, ValueError):
    shape = "?"
w(f"- model `{MAIN}` ({shape}; its `heldout.txt` is text it never saw in training); fp32 KV cache "
  "(`--kv-dtype f32`), CPU backend, batch 8")
w(f"- machine: {a.machine}; sluice {a.sluice}; whole run {a.wall} s")
w(f"- command: `bench/h2o_quality.sh` with {a.env}")
w("- every row is one `sluice score` run (exact command lines in the `.jsonl`, `cmd`; `SETS/` is the "
  "folder `bench/h2o_sets.py` writes); the prompt is prefilled densely, the continuation fed one "
  "token at a time through the decode path, so eviction acts as in generation; the first "
  "continuation token comes from the dense prefill in every configuration")
w("- **budget** = share of the prompt length P kept per layer, sequence and head: "
  "floor(H·P) heavy hitters + floor(R·P) recent tokens (`--hh-ratio H --recent-ratio R`); "
  "`--hh-ratio 0` is a recent-only window. Token-id sets have one P, and the ratios are passed as "
  "(count + 0.5)/P so each line gets exactly the intended counts")
w("- ratios in brackets: 95% paired-bootstrap intervals over the set's lines (perplexity of the "
  "first configuration over the second; < 1 means the first is better)\n")

# ---- 1. the issue's table
w("## 1. The issue's table (issue set)\n")
full = find(set="issue", config="full")
w(f"{len(full['line_tokens'])} held-out passages of 900 characters (first half the prompt, "
  f"about 110 tokens; second half the continuation), {full['tokens']} scored tokens. "
  "H2O = half heavy hitters, half recent.\n")
w("| KV budget | flags (H2O; recent-only) | full cache | H2O | recent only | H2O / full | recent / full | H2O / recent-only |")
w("|---|---|---:|---:|---:|---:|---:|---:|")
issue = {}
for b in (20, 10, 5, 40):
    h, r = find(set="issue", config="h2o", budget_pct=b), find(set="issue", config="recent", budget_pct=b)
    if not h or not r:
        continue
    c = ratio_ci(h, r)
    issue[b] = (h, r, c)
    w(f"| {b}%{' (issue)' if b in (10, 20) else ''} | `--hh-ratio {h['hh_ratio']:g} --recent-ratio {h['recent_ratio']:g}`; "
      f"`--hh-ratio 0 --recent-ratio {r['recent_ratio']:g}` | {full['perplexity']:.2f} | {h['perplexity']:.2f} | "
      f"{r['perplexity']:.2f} | {h['perplexity'] / full['perplexity']:.3f} | {r['perplexity'] / full['perplexity']:.3f} | {fmt_ci(c)} |")
w("")


# ---- 2/3. split sweeps
def sweep(set_, model=MAIN, title=""):
    full = find(model, set=set_, config="full")
    if not full:
        return {}
    w(f"| budget (tokens) | " + " | ".join(f"heavy {s}%" + (" (recent-only)" if s == 0 else " (heavy-only)" if s == 100 else "")
                                        for s in SHARES) + " | best | H2O 50% / recent-only |")
    w("|---|" + "---:|" * (len(SHARES) + 2))
    out = {}
    for b in BUDGETS:
        rs = {s: find(model, set=set_, budget_pct=b, heavy_share_pct=s, engine=None) for s in SHARES}
        rs = {s: r for s, r in rs.items() if r and r["config"] in ("h2o", "recent")}
        if not rs:
            continue
        best = min(rs, key=lambda s: rs[s]["perplexity"])
        c = ratio_ci(rs[50], rs[0]) if 50 in rs and 0 in rs else None
        out[b] = (rs, c)
        B = rs[0]["heavy"] + rs[0]["recent"]
        w(f"| {b}% ({B}) | " + " | ".join(
            (f"**{rs[s]['perplexity']:.2f}**" if s == best else f"{rs[s]['perplexity']:.2f}") + f" <sub>{rs[s]['heavy']}+{rs[s]['recent']}</sub>"
            if s in rs else "–" for s in SHARES) + f" | heavy {best}% | {fmt_ci(c) if c else '–'} |")
    w(f"\nfull cache: {full['perplexity']:.2f} ({full['tokens']} tokens). Cells: perplexity "
      "<sub>heavy+recent tokens</sub>; bold: the best split at that budget.\n")
    return out


w("## 2. Heavy/recent split at fixed budgets (long set)\n")
fl = find(set="long", config="full")
w(f"{len(fl['line_tokens'])} passages of 256 tokens (`</s>` + text from a verse start, as the model was "
  "trained), prompt = the first 192 tokens (75%), continuation = the last 64.\n")
long_sw = sweep("long")

w("## 3. Recall: a task a recent window must lose (recall sets)\n")
fr, fc = find(set="recall", config="full"), find(set="recall-control", config="full")
w(f"{len(fr['line_tokens'])} lines: `</s>` + X (40 tokens from a verse start, ending with a line break) + "
  "F tokens of other held-out text (ending with a line break) + X's first 8 tokens; the continuation "
  "is X's other 32 tokens. Only X's first occurrence, F + 9 to F + 40 tokens back, tells the model what "
  "comes; the control lines replace that first occurrence with another passage (nothing to copy). "
  "Note that the prompt is prefilled densely, so even the tokens a recent window keeps were computed "
  "with X in view.\n")
w("How much the model copies at all (full cache):\n")
w("| filler F | P | recall | control | control / recall |")
w("|---:|---:|---:|---:|---:|")
dist = {}
for F in (1, 30, 80, 150):
    x = find(set=f"recall-F{F}", config="full") if F != 150 else fr
    y = find(set=f"control-F{F}", config="full") if F != 150 else fc
    if x and y:
        dist[F] = ratio_ci(y, x)
        w(f"| {F} | {x['prompt_tokens']} | {x['perplexity']:.2f} | {y['perplexity']:.2f} | {fmt_ci(dist[F])} |")
w("\n(control / recall > 1: seeing X once helped; a model that copies would bring the repeat's "
  "perplexity close to 1, a ratio of tens.)\n")
rec_sw, copy = {}, {}
for set_, ctl, F in (("recall", "recall-control", 150), ("recall-F30", "control-F30", 30)):
    x0 = find(set=set_, config="full")
    if not x0 or not find(set=set_, budget_pct=20, heavy_share_pct=0):
        continue
    w(f"### F = {F} (P = {x0['prompt_tokens']})\n")
    rec_sw[F] = sweep(set_)
    w("Copy worth under each cache (control / recall, same configuration):\n")
    w("| configuration | recall | control | control / recall |")
    w("|---|---:|---:|---:|")
    y0 = find(set=ctl, config="full")
    copy[(F, "full")] = ratio_ci(y0, x0)
    w(f"| full cache | {x0['perplexity']:.2f} | {y0['perplexity']:.2f} | {fmt_ci(copy[(F, 'full')])} |")
    for b in BUDGETS:
        for sh, name in ((50, "H2O 50/50"), (0, "recent-only")):
            x = find(set=set_, budget_pct=b, heavy_share_pct=sh)
            y = find(set=ctl, budget_pct=b, heavy_share_pct=sh)
            if x and y:
                copy[(F, b, sh)] = ratio_ci(y, x)
                w(f"| {name} {b}% ({x['heavy']}+{x['recent']}) | {x['perplexity']:.2f} | {y['perplexity']:.2f} | {fmt_ci(copy[(F, b, sh)])} |")
    w("")

# ---- 4. sink
w("## 4. Attention sink: does keeping the first token(s) matter?\n")
w("Same total budget: recent-only; H2O with 1 or 2 heavy-hitter slots (the rest recent; the heavy slot "
  "holds position 0 after prefill in almost every head, see 5); StreamingLLM (the first 4 tokens "
  "always kept + recent; the PyTorch reference, not sluice); H2O 50/50.\n")
w("| set | budget | recent-only | H2O 1 heavy | H2O 2 heavy | StreamingLLM 4 + recent (ref) | H2O 50/50 | H2O 1 heavy / recent-only |")
w("|---|---|---:|---:|---:|---:|---:|---:|")
sink = {}
for set_ in ("long", "recall"):
    for b in (5, 10, 20):
        r0 = find(set=set_, budget_pct=b, heavy_share_pct=0)
        s1 = find(set=set_, config="h2o-sink1", budget_pct=b)
        s2 = find(set=set_, config="h2o-sink2", budget_pct=b)
        st = find(set=set_, config="ref-streaming4", budget_pct=b, engine="ref")
        h = find(set=set_, budget_pct=b, heavy_share_pct=50)
        if r0 and s1:
            c = ratio_ci(s1, r0)
            sink[(set_, b)] = c
            w(f"| {set_} | {b}% ({r0['recent']}) | {ppl(r0)} | {ppl(s1)} | {ppl(s2)} | {ppl(st)} | {ppl(h)} | {fmt_ci(c)} |")
w("")

# ---- 5. reference check and diagnostics
refrows = [r for r in rows if r.get("engine") == "ref" and r["config"] != "diag"]
worst = None
if refrows:
    w("## 5. Cross-check against an independent reference, and diagnostics\n")
    w("`bench/h2o_ref.py` is a plain PyTorch implementation of the model (weights read from the "
      "safetensors file) and of the H2O specification (column-sum prefill scores, the last R tokens "
      "plus the top H, each decode step adding its renormalised probabilities and evicting the lowest "
      "score outside the recent window), sharing no code with sluice. Its scores against sluice's:\n")
    w("| set | configuration | sluice | reference | largest line difference in sum log-prob |")
    w("|---|---|---:|---:|---:|")
    worst = 0.0
    for r in refrows:
        if r["config"] == "ref-streaming4":
            continue
        if r["config"] == "ref-full":
            s = find(set=r["set"], config="full")
        elif "hh_ratio" in r:
            s = find(set=r["set"], config="h2o", budget_pct=r["budget_pct"], heavy_share_pct=50)
        else:
            s = find(set=r["set"], heavy=r["heavy"], recent=r["recent"], heavy_share_pct=r["heavy_share_pct"])
        if not s:
            continue
        d = max(abs(x - y) for x, y in zip(r["line_sum_logprob"], s["line_sum_logprob"]))
        worst = max(worst, d)
        desc = "full" if r["config"] == "ref-full" else (
            f"H {r.get('hh_ratio', r.get('heavy'))}, R {r.get('recent_ratio', r.get('recent'))}")
        w(f"| {r['set']} | {desc} | {s['perplexity']:.4f} | {r['perplexity']:.4f} | {d:.2e} |")
    w("")
    diags = [r for r in rows if r["config"] == "diag"]
    if diags:
        w("Diagnostics (reference, first lines of the set; budget 20% of P, decode steps of the continuation):\n")
        w("| | " + " | ".join(d["set"] for d in diags) + " |")
        w("|---|" + "---:|" * len(diags))
        line = lambda name, f: w(f"| {name} | " + " | ".join(f(d) for d in diags) + " |")
        line("lines, P, budget (H2O heavy+recent)", lambda d: f"{d['lines']}, {d['prompt_tokens']}, {d['budget']} ({d['h2o_heavy']}+{d['h2o_recent']})")
        line("attention on token 0 (`</s>`), prefill rows, by layer", lambda d: " / ".join(f"{x:.3f}" for x in d["first_token_attention_prefill_by_layer"]) + f" (uniform {d['uniform_share_prefill']:.3f})")
        line("attention on token 0, decode", lambda d: f"{d['first_token_attention_decode']:.4f}")
        for k in ("9", "19", "38", "76"):
            line(f"attention on the last {k} tokens / on the best {k} (per query)",
                 lambda d, k=k: f"{d['decode_attention_on_last_w'][k]:.3f} / {d['decode_attention_on_top_w'][k]:.3f}")
        for k, name in (("h2o", "H2O 50/50"), ("recent", "recent-only"), ("h2o-heavy1", "H2O 1 heavy"),
                        ("streaming4", "StreamingLLM 4 + recent")):
            line(f"full-cache attention falling on the kept tokens: {name}",
                 lambda d, k=k: f"{d['kept_attention_mass'][k]:.3f}")
        line("H2O heavy hitters after prefill: share holding token 0", lambda d: f"{d['h2o_prefill_heavy_keeps_position0']:.3f}")
        line("... by quarter of the candidate positions (oldest first)", lambda d: " / ".join(f"{x:.2f}" for x in d["h2o_prefill_heavy_by_quarter_of_candidates"]))
        line("token 0 still kept at the end: H2O 50/50; H2O 1 heavy", lambda d: f"{d['h2o_position0_kept_at_end']:.3f}; {d['h2o_heavy1_position0_kept_at_end']:.3f}")
        if all("h2o_decode_evictions_of_token_leaving_window" in d for d in diags):
            line("H2O 50/50 decode evictions that evict the token just leaving the recent window",
                 lambda d: f"{d['h2o_decode_evictions_of_token_leaving_window']:.3f}")
        w("\n(\"on the best k\": the k keys with the highest attention for that very query, an oracle no "
          "cache policy can match; \"falling on the kept tokens\": each step's attention computed over the "
          "whole cache, summed over the tokens the policy keeps, averaged over steps, layers, lines and heads.)\n")

# ---- plot
series = []  # (panel title, full, {label: [(budget, ppl)]})
def panel(title, set_, model=MAIN, shares=SHARES):
    fr_ = find(model, set=set_, config="full")
    if not fr_:
        return
    lines = {}
    for s in shares:
        pts = [(b, find(model, set=set_, budget_pct=b, heavy_share_pct=s)) for b in BUDGETS]
        pts = [(b, r["perplexity"]) for b, r in pts if r and r.get("engine") is None and r["config"] in ("h2o", "recent")]
        if pts:
            lines["recent-only" if s == 0 else f"H2O heavy {s}%"] = pts
    ctl = find(model, set={"recall": "recall-control", "recall-F30": "control-F30"}.get(set_, ""), config="full")
    series.append((title, fr_["perplexity"], lines, ctl["perplexity"] if ctl else None))


panel("issue set (issue's table)", "issue", shares=(0, 50))
panel("long set (192 + 64 tokens)", "long")
panel("recall set, F = 150 (P = 199)", "recall")
panel("recall set, F = 30 (P = 79)", "recall-F30")
svg = a.out + ".svg"
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ncol = 2
    nrow = (len(series) + ncol - 1) // ncol
    fig, axs = plt.subplots(nrow, ncol, figsize=(11, 4.6 * nrow), squeeze=False)
    axs = axs.flatten()
    for ax in axs[len(series):]:
        ax.axis("off")
    colors = {"recent-only": "tab:blue", "H2O heavy 25%": "tab:cyan", "H2O heavy 50%": "tab:red",
              "H2O heavy 75%": "tab:orange", "H2O heavy 100%": "tab:gray"}
    for ax, (title, f, lines, ctl) in zip(axs, series):
        for lab, pts in lines.items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=lab, color=colors.get(lab),
                    lw=2.2 if lab in ("recent-only", "H2O heavy 50%") else 1.2)
        ax.axhline(f, color="k", ls="--", lw=1, label="full cache")
        if ctl:
            ax.axhline(ctl, color="k", ls=":", lw=1, label="full cache, control (nothing to copy)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(BUDGETS)
        ax.set_xticklabels([f"{b}%" for b in BUDGETS])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("KV budget (share of the prompt)")
        ax.set_ylabel("perplexity of the continuation")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"H2O vs recent-only on {os.path.basename(MAIN)} (sluice score, fp32 KV)", fontsize=11)
    fig.tight_layout()
    fig.savefig(svg)
    fig.savefig(a.out + ".png", dpi=110)
    plotnote = f"![perplexity against budget]({os.path.basename(svg)}) (also `{os.path.basename(a.out)}.png`; matplotlib)"
except ImportError:
    # a plain SVG: one panel per set, log axes
    W, H, M = 420, 320, 55
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(series)}" height="{H}" font-family="sans-serif" font-size="10">']
    pal = ["#1f77b4", "#17becf", "#d62728", "#ff7f0e", "#7f7f7f"]
    for k, (title, f, lines, ctl) in enumerate(series):
        ys = [p[1] for pts in lines.values() for p in pts] + [f] + ([ctl] if ctl else [])
        lo, hi = math.log(min(ys) * 0.95), math.log(max(ys) * 1.05)
        X = lambda b: k * W + M + (math.log(b) - math.log(5)) / (math.log(40) - math.log(5)) * (W - 2 * M)
        Y = lambda v: H - M + 15 - (math.log(v) - lo) / (hi - lo) * (H - 2 * M)
        parts.append(f'<text x="{k * W + W / 2}" y="15" text-anchor="middle">{title}</text>')
        parts.append(f'<rect x="{k * W + M}" y="{M - 25}" width="{W - 2 * M}" height="{H - 2 * M + 40 - M + 25 - 15}" fill="none" stroke="#999"/>')
        for b in BUDGETS:
            parts.append(f'<text x="{X(b):.1f}" y="{H - 12}" text-anchor="middle">{b}%</text>')
        for v in sorted({round(math.exp(lo + (hi - lo) * i / 4)) for i in range(5)}):
            parts.append(f'<text x="{k * W + M - 4}" y="{Y(v):.1f}" text-anchor="end">{v}</text>')
        parts.append(f'<line x1="{X(5):.1f}" x2="{X(40):.1f}" y1="{Y(f):.1f}" y2="{Y(f):.1f}" stroke="black" stroke-dasharray="5,3"/>')
        if ctl:
            parts.append(f'<line x1="{X(5):.1f}" x2="{X(40):.1f}" y1="{Y(ctl):.1f}" y2="{Y(ctl):.1f}" stroke="black" stroke-dasharray="1,2"/>')
        for j, (lab, pts) in enumerate(lines.items()):
            c = pal[j % len(pal)]
            parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="' +
                         " ".join(f"{X(b):.1f},{Y(v):.1f}" for b, v in pts) + '"/>')
            parts.append(f'<text x="{k * W + M + 5}" y="{M - 10 + 11 * j}" fill="{c}">{lab}</text>')
    parts.append("</svg>")
    open(svg, "w").write("\n".join(parts))
    plotnote = f"![perplexity against budget]({os.path.basename(svg)}) (plain SVG; dashed: full cache; dotted: control)"
w("## Plot\n")
w(plotnote + "\n")

# ---- reading (numbers filled in from this run)
w("## Reading\n")
h20, r20, c20 = issue[20]
h10, r10, c10 = issue[10]
F = full["perplexity"]
verdict = lambda c: "better than" if c[2] < 1 else "worse than" if c[1] > 1 else "not distinguishable from"
# where H2O 50/50 beats recent-only outside the interval, over every set and budget
wins, losses, cells = [], [], 0
for set_ in ("issue", "long", "recall", "recall-F30"):
    for b in BUDGETS:
        h = find(set=set_, budget_pct=b, heavy_share_pct=50, config="h2o")
        r = find(set=set_, budget_pct=b, heavy_share_pct=0, config="recent")
        f_ = find(set=set_, config="full")
        if h and r and f_:
            cells += 1
            c = ratio_ci(h, r)
            (wins if c[2] < 1 else losses if c[1] > 1 else []).append(
                (set_, b, h["perplexity"], r["perplexity"], f_["perplexity"], c))
name = {"issue": "issue set", "long": "long set", "recall": "recall F = 150", "recall-F30": "recall F = 30"}
w("**Summary.** " + (
    "H2O 50/50 beats a recent-only window of the same budget, outside the 95% interval, only in: " +
    "; ".join(f"{name[x[0]]} at {x[1]}% (H2O {x[2]:.2f}, full {x[4]:.2f}, recent-only {x[3]:.2f}; {fmt_ci(x[5])})" for x in wins) +
    (" — the paper's pattern in miniature: H2O close to the full cache and ahead of recent-only" if len(wins) == 1 else "") +
    f". Of all {cells} set/budget cells, H2O is worse than recent-only in {len(losses)}, not distinguishable "
    f"in {cells - len(wins) - len(losses)} and better in {len(wins)}."
    if wins else "H2O 50/50 never beats a recent-only window of the same budget outside the 95% interval.") + "\n")
close = all(issue[b][0]["perplexity"] / full["perplexity"] <= 1.05 for b in (10, 20))
ahead = all(issue[b][2][2] < 1 for b in (10, 20))
head = ("The issue's claim is reproduced on this model." if close and ahead else
        "The issue's claim is not reproduced on this model." if not close and not ahead else
        "The issue's claim is reproduced only in part on this model.")
w(f"**{head}** With the full cache the issue set scores "
  f"{F:.2f}. H2O at 20% (10% heavy + 10% recent) scores {h20['perplexity']:.2f} ({h20['perplexity'] / F:.3f}× full) "
  f"against {r20['perplexity']:.2f} for a recent-only window of the same size; at 10%, "
  f"{h10['perplexity']:.2f} against {r10['perplexity']:.2f}. H2O is {verdict(c20)} recent-only at 20% "
  f"(ratio {fmt_ci(c20)}) and {verdict(c10)} it at 10% ({fmt_ci(c10)}). The claim has two parts: H2O close "
  f"to the full cache ({'reproduced' if close else 'not reproduced'}: "
  f"{100 * (h20['perplexity'] / F - 1):+.0f}% perplexity at 20%, {100 * (h10['perplexity'] / F - 1):+.0f}% at 10%) "
  f"and H2O well ahead of recent-only ({'reproduced' if ahead else 'reversed: H2O is behind it' if all(issue[b][2][1] > 1 for b in (10, 20)) else 'not reproduced'}).\n")
if long_sw:
    parts = []
    for b, (rs, c) in long_sw.items():
        best = min(rs, key=lambda s: rs[s]["perplexity"])
        parts.append(f"{b}%: best heavy share {best}% ({rs[best]['perplexity']:.2f}; recent-only "
                     f"{rs[0]['perplexity']:.2f}, 50/50 {rs[50]['perplexity']:.2f}, heavy-only {rs[100]['perplexity']:.2f})")
    w(f"**Longer prompts and the split** (long set, P = 192, full {fl['perplexity']:.2f}): " + "; ".join(parts) +
      ". " + ("Perplexity rises with the heavy-hitter share at every budget: the more of the budget goes "
              "to heavy hitters instead of recent tokens, the worse." if all(
                  all(rs[x]["perplexity"] <= rs[y]["perplexity"] for x, y in zip(SHARES, SHARES[1:]))
                  for rs, _ in long_sw.values()) else
              "The best split is not always recent-only; see the bold cells.") + "\n")
if rec_sw:
    txt = (f"**Recall.** This model copies only weakly: with the full cache, seeing X once lowers the "
           f"perplexity of its repeat by a factor of " +
           ", ".join(f"{dist[F_][0]:.3f} at F = {F_}" for F_ in sorted(dist)) +
           " (a model that copies would bring the repeat's perplexity close to 1, a factor of tens). ")
    for F_, sw in rec_sw.items():
        cw = [(b, copy[(F_, b, 50)], copy[(F_, b, 0)]) for b in BUDGETS if (F_, b, 50) in copy and (F_, b, 0) in copy]
        txt += (f"At F = {F_} (full cache: copy worth {copy[(F_, 'full')][0]:.3f}) the copy's worth is " +
                "; ".join(f"{c50[0]:.3f} with H2O 50/50 against {c0[0]:.3f} with recent-only at {b}%" for b, c50, c0 in cw) +
                "; in perplexity, H2O 50/50 / recent-only = " +
                "; ".join(f"{fmt_ci(c)} at {b}%" for b, (rs, c) in sw.items() if c) + ". ")
    kept = [(F_, b) for F_ in rec_sw for b in BUDGETS
            if (F_, b, 50) in copy and copy[(F_, b, 50)][1] > 1 and copy[(F_, b, 0)][2] < copy[(F_, b, 50)][1]]
    txt += ("So the mechanism the paper relies on is visible: where a distant passage matters, H2O's heavy "
            "hitters keep part of it and a recent window keeps none of it (" +
            ", ".join(f"F = {F_} at {b}%" for F_, b in kept) + ", where H2O's copy worth is above 1 and above "
            "recent-only's, outside the intervals). But this model gains so little from distant text that the "
            "local context H2O gives up costs more than the distant tokens it keeps are worth, except at the "
            "largest budgets." if kept else
            "Even here H2O's heavy hitters keep no measurable part of the copy's worth.")
    w(txt + "\n")
if sink:
    w("**Attention sink.** " + "; ".join(f"{s_} {b}%: one heavy slot / recent-only {fmt_ci(c)}" for (s_, b), c in sink.items()) +
      ". One or two heavy slots (in practice token 0, see 5) against the same budget all recent changes "
      "little in either direction; the model has no attention sink to lose, unlike the large OPT models "
      "the paper studies.\n")
diags = {d["set"]: d for d in rows if d["config"] == "diag"}
if "long" in diags:
    d = diags["long"]
    km = d["kept_attention_mass"]
    pl = {"h2o": find(set="long", budget_pct=20, heavy_share_pct=50),
          "recent": find(set="long", budget_pct=20, heavy_share_pct=0),
          "streaming4": find(set="long", config="ref-streaming4", budget_pct=20, engine="ref")}
    order_note = "."
    if all(pl.values()):
        by_mass = sorted(pl, key=lambda k: -km[k])
        by_ppl = sorted(pl, key=lambda k: pl[k]["perplexity"])
        order_note = ("; the perplexities at 20% follow the same order (" if by_mass == by_ppl else
                      "; the perplexities at 20% do not follow the same order (") + ", ".join(
            f"{k} {pl[k]['perplexity']:.2f}" for k in by_ppl) + ")."
    Bk = str(d["budget"]) if str(d["budget"]) in d["decode_attention_on_top_w"] else "38"
    why = ("**Why (our reading of the evidence).** " + (f"The independent reference reproduces sluice's scores (largest line difference "
                          f"{worst:.1e} in sum log-prob, padded batches of unequal prompts included) and "
                          if worst is not None else "") +
           "tests/test_h2o.c checks the kept sets against a plain implementation, so the eviction does "
           "what the specification says; we find the reasons in the model's attention (long set, budget "
           f"{d['budget']} tokens of 192): (a) it is not sparse: the best {Bk} keys of each decode query, "
           f"chosen by an oracle for that very query, hold only {d['decode_attention_on_top_w'][Bk]:.2f} "
           "of its attention (the H2O paper, Sec. 3, reports the attention of pre-trained OPT models more "
           f"than 95% sparse); (b) it has no attention sink: token 0 gets {d['first_token_attention_decode']:.4f} "
           "of decode attention; (c) accumulated scores favour old tokens, and the old tokens are not the "
           f"ones later queries need: {100 * d['h2o_prefill_heavy_by_quarter_of_candidates'][0]:.0f}% of the "
           "heavy hitters chosen after prefill lie in the oldest quarter of the candidates, and the kept set "
           f"of H2O 50/50 holds {km['h2o']:.3f} of each step's full-cache attention against {km['recent']:.3f} "
           f"for a recent window of the same size ({km['streaming4']:.3f} for StreamingLLM's 4 + recent)" +
           (f"; in decode, {100 * d['h2o_decode_evictions_of_token_leaving_window']:.0f}% of H2O's evictions "
            "take the token that just left the recent window, whose score (a few steps' attention) cannot "
            "compete with the prefill column sums of the heavy hitters, so the heavy set chosen at prefill "
            "stays nearly frozen" if "h2o_decode_evictions_of_token_leaving_window" in d else "") + ". "
           "Less attention mass kept means outputs further from the full cache's" + order_note + " The paper's claim is made for OPT-6.7B to 175B, whose attention is sparse, "
           "with strong sinks and heavy hitters; " + (
               "a 4-layer, 9M-parameter model trained for 29 minutes on 3M tokens" if "opt-tiny-kjv" in MAIN
               else "this model") + " has neither, so on it the claim does not hold, and this run does not "
           "test the claim at the paper's scale. That needs a larger pre-trained OPT checkpoint (none is "
           "bundled or can be fetched here); the bench takes one as `MODEL=dir` (an OPT folder with "
           "vocab.json and merges.txt, plus a heldout.txt of text the model never saw).")
    w(why + "\n")
w("(Not part of this run: a copy-capable variant of the bundled model was tried, fine-tuning it for "
  "2 × 6 CPU minutes on copy windows of the KJV training part; its copy worth at F = 1 stayed where the "
  "bundled model's is, so no such model was available for this bench.)\n")
open(a.out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
