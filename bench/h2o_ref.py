#!/usr/bin/env python3
"""Independent fp32 reference of OPT scoring under KV-cache eviction.

A plain PyTorch implementation of the bundled OPT model (weights read from
model.safetensors; nothing shared with sluice) that scores `sluice score`
input lines (input_ids + continuation_ids) the way sluice does: the prompt
is prefilled densely, the continuation is fed one token at a time, and
after prefill each (layer, sequence, head) keeps only its own set of tokens:

  h2o     the H2O specification (docs: /work/shared/reference/h2o.md, sec. 6):
          prefill scores are attention column sums; keep the last R tokens
          and the top H of the rest; each decode step adds its (renormalised)
          probabilities to the scores of the kept tokens and the new one and,
          over budget, evicts the lowest score outside the recent window
          (the older on a tie).  H = 0 is a recent-only window.
  sink    StreamingLLM: the first H tokens and the last R (no scores).

It is used (1) to cross-check sluice's perplexities and (2) for diagnostics
sluice does not print: which positions the heavy hitters are, and how much
attention the first token receives.

usage: h2o_ref.py score MODEL IN.jsonl OUT.jsonl --policy h2o|sink|full --heavy H --recent R
       h2o_ref.py diag MODEL IN.jsonl OUT.json --heavy H --recent R
  (diag: attention statistics of the full cache's decode steps; for H2O
  H/R, recent-only, H2O with 1 heavy token and StreamingLLM (4 + recent) of
  the same budget, the share of the full cache's attention each step that
  falls on the kept tokens; where H2O's heavy hitters are)
Budgets are absolute token counts (the same for every line).
"""
import argparse
import json
import math
import sys

import torch
from safetensors.torch import load_file

torch.set_grad_enabled(False)


class OPT:
    def __init__(self, d):
        cfg = json.load(open(f"{d}/config.json"))
        assert cfg["do_layer_norm_before"] and cfg["activation_function"] == "relu"
        w = {k: v.float() for k, v in load_file(f"{d}/model.safetensors").items()}
        pre = "model.decoder." if "model.decoder.embed_tokens.weight" in w else "decoder."
        g = lambda n: w[pre + n]
        self.nl, self.nh = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        self.d = cfg["hidden_size"]
        self.hd = self.d // self.nh
        self.tok, self.posemb = g("embed_tokens.weight"), g("embed_positions.weight")
        self.lnf = (g("final_layer_norm.weight"), g("final_layer_norm.bias"))
        self.L = []
        for i in range(self.nl):
            p = f"layers.{i}."
            self.L.append({k: g(p + k) for k in [
                "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                "self_attn_layer_norm.weight", "self_attn_layer_norm.bias",
                "final_layer_norm.weight", "final_layer_norm.bias",
                "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]})

    def ln(self, x, wb):
        return torch.nn.functional.layer_norm(x, (self.d,), wb[0], wb[1], 1e-5)

    def lin(self, x, L, n):
        return x @ L[n + ".weight"].T + L[n + ".bias"]

    def qkv(self, L, x):
        h = self.ln(x, (L["self_attn_layer_norm.weight"], L["self_attn_layer_norm.bias"]))
        B, T, _ = h.shape
        sh = lambda t: t.view(B, T, self.nh, self.hd).transpose(1, 2)  # B nh T hd
        return (sh(self.lin(h, L, "self_attn.q_proj") * self.hd ** -0.5),
                sh(self.lin(h, L, "self_attn.k_proj")), sh(self.lin(h, L, "self_attn.v_proj")))

    def post(self, L, x, o):
        B, _, T, _ = o.shape
        x = x + self.lin(o.transpose(1, 2).reshape(B, T, self.d), L, "self_attn.out_proj")
        h = self.ln(x, (L["final_layer_norm.weight"], L["final_layer_norm.bias"]))
        return x + self.lin(torch.relu(self.lin(h, L, "fc1")), L, "fc2")

    def logits(self, x):
        return self.ln(x, self.lnf) @ self.tok.T


def run(m, prompts, conts, policy, H, R, diag=None):
    """prompts: B lists of equal length P; conts: B lists of equal length C.
    Returns B lists of C log-probabilities."""
    B, P, C = len(prompts), len(prompts[0]), len(conts[0])
    T = P + C
    ids = torch.tensor([p + c for p, c in zip(prompts, conts)])
    pos = torch.arange(T)
    K = torch.zeros(m.nl, B, m.nh, T, m.hd)
    V = torch.zeros_like(K)
    score = torch.zeros(m.nl, B, m.nh, T)
    kept = torch.zeros(m.nl, B, m.nh, T, dtype=torch.bool)
    budget = H + R
    # prefill, dense
    x = m.tok[ids[:, :P]] + m.posemb[pos[:P] + 2]
    causal = torch.ones(P, P, dtype=torch.bool).tril()
    for l, L in enumerate(m.L):
        q, k, v = m.qkv(L, x)
        K[l, :, :, :P], V[l, :, :, :P] = k, v
        a = (q @ k.transpose(-1, -2)).masked_fill(~causal, -math.inf).softmax(-1)
        if diag is not None and policy == "full":
            diag.setdefault("first_token_mass_prefill", []).append(a[..., 1:, 0].mean().item())
        col = a.sum(-2)  # B nh P
        score[l, :, :, :P] = col
        x = m.post(L, x, a @ v)
        if policy == "full" or P <= budget:
            kept[l, :, :, :P] = True
            continue
        kept[l, :, :, P - R:P] = True
        if H:
            if policy == "h2o":
                # exact ties between float column sums do not occur in practice
                top = torch.topk(col[..., :P - R], H, dim=-1).indices
                kept[l].scatter_(-1, top, True)
            else:  # sink: the first H tokens
                kept[l, :, :, :H] = True
        score[l] *= kept[l]
    if diag is not None:
        diag["heavy_positions_after_prefill"] = [
            [[torch.nonzero(kept[l, b, h, :P - R]).flatten().tolist() for h in range(m.nh)]
             for b in range(B)] for l in range(m.nl)]
    lp = []
    out = m.logits(x[:, -1]).log_softmax(-1)
    for t in range(C):
        tok = ids[:, P + t]
        lp.append(out.gather(-1, tok[:, None])[:, 0])
        if t == C - 1:
            break
        p = P + t
        x = (m.tok[tok] + m.posemb[p + 2])[:, None]
        for l, L in enumerate(m.L):
            q, k, v = m.qkv(L, x)
            K[l, :, :, p], V[l, :, :, p] = k[:, :, 0], v[:, :, 0]
            kept[l, :, :, p] = True
            s = (q @ K[l, :, :, :p + 1].transpose(-1, -2))[:, :, 0]  # B nh p+1
            a = s.masked_fill(~kept[l, :, :, :p + 1], -math.inf).softmax(-1)
            if diag is not None:
                # the attention this query would give with the whole cache
                full = s.softmax(-1)
                diag.setdefault("kept_mass", []).append(
                    (full * kept[l, :, :, :p + 1]).sum(-1).mean().item())
                if policy == "full":
                    diag.setdefault("first", []).append(full[..., 0].mean().item())
                    srt = full.sort(-1, descending=True).values.cumsum(-1)
                    for w in (9, 19, 38, 76):
                        diag.setdefault(f"last{w}", []).append(
                            full[..., max(0, p + 1 - w):].sum(-1).mean().item())
                        diag.setdefault(f"top{w}", []).append(srt[..., min(w, p + 1) - 1].mean().item())
            score[l, :, :, :p + 1] += a
            x = m.post(L, x, (a[:, :, None] @ V[l, :, :, :p + 1]))
            if policy == "h2o" and kept[l, 0, 0].sum() > budget:
                c = kept[l, :, :, :p + 1] & (pos[:p + 1] <= p - R)
                sc = score[l, :, :, :p + 1].masked_fill(~c, math.inf)
                v_ = sc.argmin(-1, keepdim=True)  # first = oldest on a tie
                if diag is not None:  # was it the token just leaving the recent window?
                    diag.setdefault("evict_leaving", []).append((v_ == p - R).float().mean().item())
                kept[l, :, :, :p + 1].scatter_(-1, v_, False)
                score[l, :, :, :p + 1].scatter_(-1, v_, 0.0)
            elif policy == "sink" and p - R >= H and budget < p + 1:
                kept[l, :, :, p - R] = False
        out = m.logits(x[:, 0]).log_softmax(-1)
    if diag is not None:
        diag["position0_kept_end"] = kept[..., 0].float().mean().item()
    return torch.stack(lp, 1).tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["score", "diag"])
    ap.add_argument("model")
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--policy", default="h2o", choices=["h2o", "sink", "full"])
    ap.add_argument("--heavy", type=int, default=0)
    ap.add_argument("--recent", type=int, default=0)
    ap.add_argument("--hh-ratio", type=float, default=-1.0,
                    help="instead of --heavy: floor(ratio x prompt length), per line (as sluice)")
    ap.add_argument("--recent-ratio", type=float, default=-1.0)
    ap.add_argument("--tokenize", action="store_true",
                    help="lines carry prompt/continuation text: encode them as sluice does")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m = OPT(a.model)
    rows = [json.loads(l) for l in open(a.inp) if l.strip()]
    if a.limit:
        rows = rows[:a.limit]
    if a.tokenize:
        from tokenizers import Tokenizer, pre_tokenizers
        from tokenizers.models import BPE
        tk = Tokenizer(BPE.from_file(f"{a.model}/vocab.json", f"{a.model}/merges.txt"))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        for r in rows:  # prompt: `</s>` prepended; continuation: as is
            r["input_ids"] = [2] + tk.encode(r.pop("prompt")).ids
            r["continuation_ids"] = tk.encode(r.pop("continuation")).ids
    if a.mode == "diag":
        P = len(rows[0]["input_ids"])
        pr, co = [r["input_ids"] for r in rows], [r["continuation_ids"] for r in rows]
        B = a.heavy + a.recent
        mean = lambda v: sum(v) / len(v)
        d = {}
        run(m, pr, co, "full", 0, 0, d)
        res = {"lines": len(rows), "prompt_tokens": P, "budget": B,
               "first_token_attention_prefill_by_layer": d["first_token_mass_prefill"],
               "uniform_share_prefill": mean([1 / (i + 1) for i in range(1, P)]),
               "first_token_attention_decode": mean(d["first"]),
               "decode_attention_on_last_w": {w: mean(d[f"last{w}"]) for w in (9, 19, 38, 76)},
               "decode_attention_on_top_w": {w: mean(d[f"top{w}"]) for w in (9, 19, 38, 76)},
               "kept_attention_mass": {}}
        for name, pol, H, R in [("h2o", "h2o", a.heavy, a.recent), ("recent", "h2o", 0, B),
                                ("h2o-heavy1", "h2o", 1, B - 1), ("streaming4", "sink", 4, B - 4)]:
            e = {}
            run(m, pr, co, pol, H, R, e)
            res["kept_attention_mass"][name] = mean(e["kept_mass"])
            if name == "h2o":
                hp = e["heavy_positions_after_prefill"]
                flat = [j for L in hp for b in L for h in b for j in h]
                sets = [h for L in hp for b in L for h in b]
                res["h2o_heavy"], res["h2o_recent"] = H, R
                res["h2o_prefill_heavy_keeps_position0"] = mean([0 in h for h in sets])
                res["h2o_prefill_heavy_position_mean"] = mean(flat)
                res["h2o_prefill_heavy_by_quarter_of_candidates"] = [
                    mean([q * (P - R) / 4 <= j < (q + 1) * (P - R) / 4 for j in flat]) for q in range(4)]
                res["h2o_position0_kept_at_end"] = e["position0_kept_end"]
                res["h2o_decode_evictions_of_token_leaving_window"] = mean(e["evict_leaving"])
            if name == "h2o-heavy1":
                res["h2o_heavy1_position0_kept_at_end"] = e["position0_kept_end"]
        json.dump(res, open(a.out, "w"), indent=1)
        print(json.dumps(res))
        return
    # group equal shapes into batches
    groups = {}
    for i, r in enumerate(rows):
        groups.setdefault((len(r["input_ids"]), len(r["continuation_ids"])), []).append(i)
    res = [None] * len(rows)
    for idx in groups.values():
        for s in range(0, len(idx), a.batch):
            part = idx[s:s + a.batch]
            P = len(rows[part[0]]["input_ids"])
            H = math.floor(a.hh_ratio * P) if a.hh_ratio >= 0 else a.heavy
            R = math.floor(a.recent_ratio * P) if a.recent_ratio >= 0 else a.recent
            lps = run(m, [rows[i]["input_ids"] for i in part],
                      [rows[i]["continuation_ids"] for i in part], a.policy, H, R)
            for i, lp in zip(part, lps):
                res[i] = lp
    with open(a.out, "w") as f:
        for r, lp in zip(rows, res):
            f.write(json.dumps({"id": r.get("id"), "logprobs": lp, "sum_logprob": sum(lp),
                                "perplexity": math.exp(-sum(lp) / len(lp))}) + "\n")


if __name__ == "__main__":
    main()
