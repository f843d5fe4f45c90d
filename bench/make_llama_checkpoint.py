#!/usr/bin/env python3
"""Write a dummy LLaMA-family checkpoint for the CPU throughput bench
(bench/llama_cpu_compare.sh): a real Hugging Face folder (config.json,
model.safetensors in fp16, generation_config.json) of a named shape with
random weights, which sluice (--model DIR) and transformers
(from_pretrained(DIR)) both load, so both run the same weights.

Shapes (the published configs' widths; fewer layers where the whole model
would not fit this project's 2-vCPU, 23 GiB development machines):

  llama-2-7b-2l   2 layers of Llama-2-7B (hidden 4096, 32 heads, MLP 11008,
                  vocab 32000): 0.67 B parameters, 1.3 GB in fp16
  llama-3-8b-2l   2 layers of Llama-3-8B (hidden 4096, 32 heads over 8 KV
                  heads, MLP 14336, vocab 128256, rope_theta 500000):
                  1.5 B parameters, 3.0 GB
  tinyllama       TinyLlama-1.1B whole (22 layers, hidden 2048, 32 heads
                  over 4 KV heads, MLP 5632, vocab 32000): 1.1 B, 2.2 GB
  llama-small     a small Llama for a check that the bench runs (4 layers,
                  hidden 256, 8 heads over 2 KV heads, MLP 688, vocab 32000)

Weights: transformers' own initialisation (normal, std 0.02) of
LlamaForCausalLM.from_config with a fixed seed, stored in fp16; the
numbers do not matter for throughput (the bench ignores EOS on both sides).

    python3 bench/make_llama_checkpoint.py SHAPE OUTDIR

Writes OUTDIR/SHAPE/ (replacing it), prints its path.
"""
import json
import os
import shutil
import sys
import time

LLAMA2 = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
              intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096,
              rope_theta=10000.0, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
SHAPES = {
    "llama-2-7b-2l": dict(LLAMA2, num_hidden_layers=2),
    "llama-3-8b-2l": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                          intermediate_size=14336, vocab_size=128256,
                          max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                          bos_token_id=128000, eos_token_id=128001, num_hidden_layers=2),
    "tinyllama": dict(LLAMA2, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                      intermediate_size=5632, max_position_embeddings=2048,
                      num_hidden_layers=22),
    "llama-small": dict(LLAMA2, hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                        intermediate_size=688, max_position_embeddings=2048,
                        num_hidden_layers=4),
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: {sys.argv[0]} SHAPE OUTDIR (SHAPE: {', '.join(SHAPES)})")
    name, root = sys.argv[1], sys.argv[2]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.time()
    cfg = LlamaConfig(**SHAPES[name], hidden_act="silu", tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False)
    torch.manual_seed(0)
    with torch.no_grad():
        model = LlamaForCausalLM(cfg).to(torch.float16).eval()
    out = os.path.join(root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    dtype = written.get("dtype", written.get("torch_dtype"))
    assert dtype == "float16", f"config.json says dtype {dtype}"
    n = sum(p.numel() for p in model.parameters())
    print(f"{out}: {n / 1e9:.2f} B parameters, fp16, {time.time() - t0:.0f} s", file=sys.stderr)
    print(out)


if __name__ == "__main__":
    main()
