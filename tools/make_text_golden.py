#!/usr/bin/env python3
"""make_text_golden.py - Hugging Face's answers for text jobs on the bundled
model, so that sluice's text path (tokenizer, generation, decoding, scoring)
is checked end to end against transformers.

    python3 tools/make_text_golden.py [--model models/opt-tiny-kjv] [--out tests/fixtures/kjv-golden.json]

For each text prompt: the ids HF's tokenizer gives (with OPT's leading
</s>), the greedy continuation of transformers' generate() in fp32 (new ids,
cut after a first EOS), its decoded text (skip_special_tokens=True), and
the smallest top1 - top2 logit gap met on the way.  For each (prompt,
continuation) pair: the continuation's log-probabilities.  Deterministic.
"""
import argparse
import json

import torch
from transformers import AutoTokenizer, OPTForCausalLM

PROMPTS = [
    "In the beginning",
    "And the LORD said unto Moses,",
    "Blessed are the",
    "And it came to pass, when",
    "The LORD is my shepherd;",
    "Then Jesus answered and said unto them,",
]
SCORE_PAIRS = [
    ("In the beginning was the", " Word, and the Word was with God"),
    ("And God said, Let there be", " light: and there was light."),
    ("Grace be unto you, and", " peace, from God our Father"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/opt-tiny-kjv")
    ap.add_argument("--out", default="tests/fixtures/kjv-golden.json")
    ap.add_argument("--new-tokens", type=int, default=24)
    a = ap.parse_args()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = OPTForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32,
                                           attn_implementation="eager").eval()
    gen = []
    for p in PROMPTS:
        ids = tok(p)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=a.new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id, output_scores=True,
                                 return_dict_in_generate=True)
        new = out.sequences[0, len(ids):].tolist()
        if tok.eos_token_id in new:
            new = new[: new.index(tok.eos_token_id) + 1]
        margin = min(float(s[0].topk(2).values[0] - s[0].topk(2).values[1])
                     for s in out.scores[: len(new)])
        gen.append({"prompt": p, "input_ids": ids, "output_ids": new,
                    "completion": tok.decode(new, skip_special_tokens=True),
                    "min_margin": round(margin, 6)})
    score = []
    for p, c in SCORE_PAIRS:
        pi = tok(p)["input_ids"]
        ci = tok(c, add_special_tokens=False)["input_ids"]
        x = torch.tensor([pi + ci])
        with torch.no_grad():
            lp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
        score.append({"prompt": p, "continuation": c, "input_ids": pi, "continuation_ids": ci,
                      "logprobs": [float(lp[len(pi) + j - 1, t]) for j, t in enumerate(ci)]})
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "new_tokens": a.new_tokens, "generate": gen, "score": score},
                  f, indent=1)
    for g in gen:
        print(f"{g['prompt']!r} -> {g['completion']!r} (margin {g['min_margin']})")


if __name__ == "__main__":
    main()
