#!/usr/bin/env python3
"""Evaluation sets for bench/h2o_quality.sh, from the model's held-out text.

usage: h2o_sets.py MODEL_DIR OUT_DIR [--passages N] [--chars C] [--long N]
                   [--recall N] [--filler F]

Writes to OUT_DIR (JSON Lines, `sluice score` input):
  issue.jsonl   the issue's set, unchanged from the first version of the
                bench: N passages of C characters spread evenly over the
                held-out text, first half (at a space) the prompt text,
                second half the continuation text.  sluice tokenizes them
                (prompt lengths vary, so floor(ratio x P) varies per line).
  long.jsonl    passages of exactly 256 tokens (the model's training window:
                `</s>` then text from a verse start), prompt = the first 192
                tokens, continuation = the last 64; as token ids, so every
                prompt has the same length and a ratio gives an exact count.
  recall.jsonl  a copy task where a recent window must lose:
                `</s>` + X (40 tokens: 39 from a verse start and a line break)
                + filler (F tokens of other held-out text, the last a line
                break) + X[:8]; continuation = X[8:40] (32 tokens).  The model can only copy X
                if it kept X's first occurrence, F + 8 or more tokens back.
  recall-control.jsonl
                the same lines with the first occurrence of X replaced by
                another 40-token passage: the continuation's perplexity when
                there is nothing to copy (how much the copy is worth).
Token ids come from the model's own byte-level BPE (vocab.json, merges.txt),
through the `tokenizers` package; sluice's tokenizer gives the same ids.
"""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("out")
ap.add_argument("--passages", type=int, default=48)
ap.add_argument("--chars", type=int, default=900)
ap.add_argument("--long", type=int, default=96)
ap.add_argument("--recall", type=int, default=64)
ap.add_argument("--filler", type=int, default=150)
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
text = open(f"{a.model}/heldout.txt", encoding="utf-8").read()

# issue set: byte-identical to the first bench version
n, chars = a.passages, a.chars
step = max(chars, (len(text) - chars) // n)
with open(f"{a.out}/issue.jsonl", "w") as f:
    for i in range(n):
        s = text[i * step:i * step + chars]
        cut = s.rfind(" ", 0, chars // 2)
        f.write(json.dumps({"id": i, "prompt": s[:cut], "continuation": s[cut:]}) + "\n")

try:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import BPE
except ImportError:
    sys.exit("h2o_sets.py: needs the python package `tokenizers` (pip install tokenizers)")
tok = Tokenizer(BPE.from_file(f"{a.model}/vocab.json", f"{a.model}/merges.txt"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
enc = lambda s: tok.encode(s).ids
EOS = 2
NL = enc("\n")
assert len(NL) == 1, NL

# verse starts (character offsets of non-empty lines)
starts, off = [], 0
for line in text.split("\n"):
    if line.strip():
        starts.append(off)
    off += len(line) + 1


def chunk(vi, ntok):
    """ntok tokens of text from verse vi's start (enough characters taken)."""
    ids = enc(text[starts[vi]:starts[vi] + 8 * ntok])
    assert len(ids) >= ntok
    return ids[:ntok]


# long: 256-token windows from verse starts spread over the text
with open(f"{a.out}/long.jsonl", "w") as f:
    for i in range(a.long):
        ids = [EOS] + chunk(i * len(starts) // a.long, 255)
        f.write(json.dumps({"id": i, "input_ids": ids[:192], "continuation_ids": ids[192:]}) + "\n")

# recall: X, filler, X again; X and filler from different parts of the text
X, K, F = 40, 8, a.filler
assert 1 + X + F + X <= 256, "recall lines must fit the 256 positions the model was trained on"
nv = len(starts)
with open(f"{a.out}/recall.jsonl", "w") as fr, open(f"{a.out}/recall-control.jsonl", "w") as fc:
    for i in range(a.recall):
        v = (i * nv // a.recall + 7) % nv            # the passage to recall
        fv = (v + nv // 3) % nv                        # filler, a third of the text away
        cv = (v + 2 * nv // 3) % nv                    # control's replacement passage
        x = chunk(v, X - 1) + NL
        filler = chunk(fv, F - 1) + NL
        other = chunk(cv, X - 1) + NL
        tail = filler + x[:K]
        fr.write(json.dumps({"id": i, "input_ids": [EOS] + x + tail, "continuation_ids": x[K:]}) + "\n")
        fc.write(json.dumps({"id": i, "input_ids": [EOS] + other + tail, "continuation_ids": x[K:]}) + "\n")
print(f"h2o_sets.py: {n} issue, {a.long} long (192+64), {a.recall} recall (prompt {1 + X + F + K}"
      f" + 32) lines in {a.out}", file=sys.stderr)
