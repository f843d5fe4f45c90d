#!/usr/bin/env python3
"""CPU baseline: Hugging Face transformers OPT batch generation throughput.

Builds an OPT model with the published shapes and random weights (no hub
access), then times, FlexGen style:

  prefill_s         one forward pass over the [batch, prompt_len] prompt batch
                    (use_cache=True, logits only for the last position, as
                    HF generate does); it yields the first new token
  decode_s          the remaining gen_len-1 greedy decode steps, one token per
                    step, reusing the model's own KV cache object
  throughput_tok_s  batch * gen_len / (prefill_s + decode_s)

A warm-up generation (prompt 8, 1 new token) runs first and is not timed.
With --repeat R the measurement is repeated and the median of each metric is
reported (the per-run numbers are kept under "runs" in the JSON).

Example:
  python3 bench/hf_cpu_bench.py --model opt-125m --prompt-len 128 \\
      --gen-len 32 --batch 8 --json
"""

import argparse
import inspect
import json
import os
import statistics
import sys
import time

MODELS = {
    # name: (layers, heads, hidden, word_embed_proj_dim, do_layer_norm_before)
    "opt-125m": (12, 12, 768, 768, True),
    "opt-350m": (24, 16, 1024, 512, False),
    "opt-1.3b": (24, 32, 2048, 2048, True),
    "opt-2.7b": (32, 32, 2560, 2560, True),
    "opt-6.7b": (32, 32, 4096, 4096, True),
}
VOCAB = 50272
MAX_POS = 2048


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="HF transformers CPU baseline for sluice")
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--gen-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--force", action="store_true",
                    help="run even if the weights look larger than available memory")
    a = ap.parse_args(argv)
    if a.prompt_len < 1 or a.gen_len < 1 or a.batch < 1 or a.repeat < 1 or a.threads < 1:
        ap.error("prompt-len, gen-len, batch, repeat and threads must be >= 1")
    if a.prompt_len + a.gen_len > MAX_POS:
        ap.error(f"prompt-len + gen-len must be <= {MAX_POS}")
    return a


def opt_config(name, dtype_name):
    from transformers import OPTConfig
    layers, heads, hidden, proj, pre_ln = MODELS[name]
    return OPTConfig(
        num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden,
        ffn_dim=4 * hidden, word_embed_proj_dim=proj, do_layer_norm_before=pre_ln,
        vocab_size=VOCAB, max_position_embeddings=MAX_POS,
        activation_function="relu", enable_bias=True, dropout=0.0,
        attention_dropout=0.0, layerdrop=0.0, pad_token_id=1, bos_token_id=2,
        eos_token_id=2, tie_word_embeddings=True, dtype=dtype_name,
    )


def n_params(name):
    layers, _, h, proj, _ = MODELS[name]
    per_layer = 4 * h * h + 4 * h + 2 * 4 * h * h + 4 * h + h + 4 * h  # attn, ffn, 2 LN
    n = layers * per_layer + VOCAB * proj + (MAX_POS + 2) * h
    n += (2 * h * proj) if proj != h else 2 * h  # project_in/out, or final LN
    return n


def mem_available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def build_model(name, dtype, seed):
    """Random-weight OPTForCausalLM without HF's (slow) default init."""
    import torch
    from transformers import OPTForCausalLM
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights

    cfg = opt_config(name, "float32" if dtype == torch.float32 else "bfloat16")
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = OPTForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    # no_init_weights also skips HF's init_weights(), which is where the
    # lm_head <-> embed_tokens tie is made: tie explicitly
    model.tie_weights()
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    gen = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if "layer_norm" in pname and pname.endswith(".weight"):
                p.fill_(1.0)
            elif pname.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.to(dtype).eval()


def cache_kwarg(model):
    """transformers 5.x renamed past_key_values -> cache in forward()."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(out):
    c = getattr(out, "cache", None)
    return c if c is not None else out.past_key_values


def run_once(model, ids, gen_len, ckw):
    """Greedy generation; returns (prefill_s, decode_s, generated ids)."""
    import torch
    extra = {}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        extra["logits_to_keep"] = 1
    t0 = time.perf_counter()
    out = model(input_ids=ids, use_cache=True, **extra)
    nxt = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
    cache = returned_cache(out)
    t1 = time.perf_counter()
    toks = [nxt]
    for _ in range(gen_len - 1):
        out = model(input_ids=nxt, use_cache=True, **{ckw: cache}, **extra)
        cache = returned_cache(out)
        nxt = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        toks.append(nxt)
    t2 = time.perf_counter()
    del cache, out
    return t1 - t0, t2 - t1, torch.cat(toks, dim=1)


def main(argv=None):
    a = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]

    need = n_params(a.model) * (4 if a.dtype == "fp32" else 2)
    avail = mem_available_bytes()
    if avail is not None and need > 0.9 * avail and not a.force:
        sys.exit(f"hf_cpu_bench: {a.model} {a.dtype} weights need ~{need / 2**30:.1f} GiB, "
                 f"only {avail / 2**30:.1f} GiB available (use --force to try anyway)")

    tb = time.perf_counter()
    model = build_model(a.model, dtype, a.seed)
    build_s = time.perf_counter() - tb
    ckw = cache_kwarg(model)

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(3, VOCAB, (a.batch, a.prompt_len), generator=g)
    warm = torch.randint(3, VOCAB, (a.batch, 8), generator=g)

    runs = []
    with torch.inference_mode():
        run_once(model, warm, 1, ckw)  # warm-up: prompt 8, 1 new token
        for _ in range(a.repeat):
            pre, dec, _toks = run_once(model, ids, a.gen_len, ckw)
            runs.append({"prefill_s": pre, "decode_s": dec,
                         "throughput_tok_s": a.batch * a.gen_len / (pre + dec)})

    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    res = {
        "system": "hf-transformers",
        "model": a.model,
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "batch": a.batch,
        "threads": a.threads,
        "dtype": a.dtype,
        "prefill_s": round(med["prefill_s"], 6),
        "decode_s": round(med["decode_s"], 6),
        "throughput_tok_s": round(med["throughput_tok_s"], 4),
        "repeat": a.repeat,
        "runs": [{k: round(v, 6) for k, v in r.items()} for r in runs],
        "build_s": round(build_s, 3),
        "attn_implementation": model.config._attn_implementation,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"hf-transformers {a.model} {a.dtype} P={a.prompt_len} G={a.gen_len} "
              f"B={a.batch} threads={a.threads}: prefill {res['prefill_s']:.3f} s, "
              f"decode {res['decode_s']:.3f} s, {res['throughput_tok_s']:.2f} tok/s "
              f"(median of {a.repeat}; attn={res['attn_implementation']}, "
              f"torch {torch.__version__}, transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
