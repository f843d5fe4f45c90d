#!/usr/bin/env python3
"""Write tests/fixtures/rope-inv-freq.json: RoPE's inverse frequencies as
Hugging Face transformers computes them, for tests/test_ops.c to check
sl_rope_inv_freq (kernels/rope_freq.c) against.

Each case builds a LlamaConfig in the form published checkpoints use
(rope_theta and rope_scaling as in their config.json), lets transformers
read it, and records the inv_freq buffer of LlamaRotaryEmbedding (fp32,
each value written as the exact decimal of the float) and its
attention_scaling, which must be 1 for every scaling the rope op knows
(the op has no such factor).  No weights, no hub.

Usage: python3 tools/make_rope_fixture.py [--out tests/fixtures/rope-inv-freq.json]
Needs torch and transformers (e.g. /work/venv-llama, see tests/fixtures/README.md).
"""

import argparse
import json
import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

# (name, head_dim, rope_theta, rope_scaling or None)
CASES = [
    ("llama-2", 128, 10000.0, None),
    ("mistral-qwen2", 128, 1000000.0, None),
    ("small-head", 16, 10000.0, None),
    ("linear-4", 128, 10000.0, {"rope_type": "linear", "factor": 4.0}),
    ("llama-3.1", 128, 500000.0,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("llama-3.2", 64, 500000.0,
     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # a short original context, so that a small head has frequencies in
    # all three bands (kept, smoothed, divided)
    ("llama3-small", 16, 10000.0,
     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
]


def inv_freq_of(head_dim, theta, scaling):
    heads = 2
    cfg = dict(hidden_size=head_dim * heads, num_attention_heads=heads,
               num_key_value_heads=heads, num_hidden_layers=1, intermediate_size=8,
               vocab_size=8, max_position_embeddings=4096, rope_theta=theta)
    if scaling is not None:
        cfg["rope_scaling"] = dict(scaling)
    config = LlamaConfig(**cfg)
    rot = LlamaRotaryEmbedding(config)
    inv = rot.inv_freq
    assert inv.dtype == torch.float32 and inv.shape == (head_dim // 2,)
    return [float(x) for x in inv.tolist()], float(rot.attention_scaling)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/rope-inv-freq.json")
    args = ap.parse_args()
    cases = []
    for name, hd, theta, scaling in CASES:
        inv, att = inv_freq_of(hd, theta, scaling)
        assert att == 1.0, (name, att)
        c = {"name": name, "head_dim": hd, "rope_theta": theta,
             "rope_type": scaling["rope_type"] if scaling else "default"}
        if scaling:
            c.update({k: v for k, v in scaling.items() if k != "rope_type"})
        c["attention_scaling"] = att
        c["inv_freq"] = inv
        cases.append(c)
    doc = {"what": "LlamaRotaryEmbedding.inv_freq (fp32) per config; "
                   "tools/make_rope_fixture.py",
           "transformers_version": transformers.__version__,
           "torch_version": torch.__version__.split("+")[0],
           "cases": cases}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
