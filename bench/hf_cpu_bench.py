#!/usr/bin/env python3
"""CPU baseline: Hugging Face transformers generation as a user runs it.

Builds an OPT model of the published shapes with random weights (no hub
access) the library's way, or loads a checkpoint folder (--checkpoint DIR,
any model transformers reads: the LLaMA family's bench/llama_cpu_compare.sh
writes them), and times the library's own generation:

  model = AutoModelForCausalLM.from_config(OPTConfig(...shapes...)).eval()
    (--checkpoint: AutoModelForCausalLM.from_pretrained(DIR).eval())
  out = model.generate(input_ids, attention_mask=mask, max_new_tokens=G,
                       min_new_tokens=G, do_sample=False)

Nothing is tuned: torch's default thread count (all cores) unless --threads
is given, the default attention implementation (sdpa), fp32 unless --dtype
says otherwise. --dtype fp16 builds the model from a config whose dtype is
float16, which is what `from_pretrained("facebook/opt-...")` gives with
transformers 5 (the hub configs say float16 and the default dtype is "auto").
With --checkpoint the default is --dtype auto: from_pretrained without a
dtype, transformers 5's default, which keeps the checkpoint's dtype (fp16
for the LLaMA bench's checkpoints); another --dtype passes it as dtype=.

Timing, per repetition, of one generate call:
  total_s           the wall time of the call, end to end (as a user times it)
  prefill_s         from the call to the first new token, taken by a streamer
                    (generate hands it each step's tokens; it only reads the
                    clock); this is the prompt's forward pass and the first
                    token's selection
  decode_s          total_s - prefill_s: the other gen_len-1 steps
  throughput_tok_s  batch * gen_len / total_s
  cpu_s             the process's CPU time during the call (all threads)
A warm-up call (the same batch, prompt 8, 2 new tokens) runs first and is not
timed. With --repeat R the medians are reported; every run is under "runs".

Example:
  python3 bench/hf_cpu_bench.py --model opt-125m --prompt-len 128 \\
      --gen-len 32 --batch 8 --json
"""

import argparse
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
DTYPES = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="HF transformers CPU baseline for sluice")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=sorted(MODELS))
    src.add_argument("--checkpoint", metavar="DIR",
                     help="a checkpoint folder, loaded with from_pretrained")
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--gen-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads(N); default: torch's own choice")
    ap.add_argument("--dtype", choices=sorted(DTYPES) + ["auto"], default=None,
                    help="default fp32 (--model), auto (--checkpoint: from_pretrained's default)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--force", action="store_true",
                    help="run even if the weights look larger than available memory")
    a = ap.parse_args(argv)
    if a.prompt_len < 1 or a.gen_len < 1 or a.batch < 1 or a.repeat < 1 or a.threads < 0:
        ap.error("prompt-len, gen-len, batch and repeat must be >= 1, threads >= 0")
    if a.dtype is None:
        a.dtype = "auto" if a.checkpoint else "fp32"
    if a.checkpoint:
        if not os.path.isfile(os.path.join(a.checkpoint, "config.json")):
            ap.error(f"{a.checkpoint}: no config.json (not a checkpoint folder)")
        with open(os.path.join(a.checkpoint, "config.json")) as f:
            max_pos = json.load(f).get("max_position_embeddings", MAX_POS)
    else:
        max_pos = MAX_POS
    if a.prompt_len + a.gen_len > max_pos:
        ap.error(f"prompt-len + gen-len must be <= {max_pos}")
    return a


def opt_config(name, dtype_name):
    from transformers import OPTConfig
    layers, heads, hidden, proj, pre_ln = MODELS[name]
    kw = {} if dtype_name in (None, "auto") else {"dtype": dtype_name}
    return OPTConfig(
        num_hidden_layers=layers, num_attention_heads=heads, hidden_size=hidden,
        ffn_dim=4 * hidden, word_embed_proj_dim=proj, do_layer_norm_before=pre_ln,
        vocab_size=VOCAB, max_position_embeddings=MAX_POS, **kw)


def n_params(name):
    layers, _, h, proj, _ = MODELS[name]
    per_layer = 4 * h * h + 4 * h + 2 * 4 * h * h + 4 * h + h + 4 * h  # attn, ffn, 2 LN
    n = layers * per_layer + VOCAB * proj + (MAX_POS + 2) * h
    n += (2 * h * proj) if proj != h else 2 * h  # project_in/out, or final LN
    return n


def checkpoint_bytes(path, dtype):
    """The weights' bytes once loaded: the safetensors files' size, doubled
    for fp32 (the bench's checkpoints are stored in fp16)."""
    n = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
            if f.endswith(".safetensors"))
    return n * (2 if dtype == "fp32" else 1)


def mem_available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def loaded_blas_libs():
    """The BLAS-like shared libraries this process has mapped."""
    names = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if any(s in base.lower() for s in ("blas", "mkl", "dnnl", "gomp", "iomp")):
                    names.add(base)
    except OSError:
        pass
    return sorted(names)


class FirstTokenClock:
    """A generate streamer that notes when the first new token arrives."""

    def __init__(self):
        self.puts = 0
        self.first_token_t = None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:  # the first put is the prompt
            self.first_token_t = time.perf_counter()

    def end(self):
        pass


def run_once(model, ids, mask, gen_len):
    import torch
    clock = FirstTokenClock()
    c0 = time.process_time()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=gen_len,
                         min_new_tokens=gen_len, do_sample=False, streamer=clock)
    t1 = time.perf_counter()
    cpu = time.process_time() - c0
    if out.shape != (ids.shape[0], ids.shape[1] + gen_len) or not torch.equal(out[:, :ids.shape[1]], ids):
        raise RuntimeError(f"generate returned shape {tuple(out.shape)}, expected "
                           f"{(ids.shape[0], ids.shape[1] + gen_len)} starting with the prompt")
    prefill = clock.first_token_t - t0
    return {"total_s": t1 - t0, "prefill_s": prefill, "decode_s": t1 - clock.first_token_t,
            "cpu_s": cpu, "throughput_tok_s": ids.shape[0] * gen_len / (t1 - t0)}


def main(argv=None):
    a = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    if a.threads:
        torch.set_num_threads(a.threads)

    if a.checkpoint:
        need = checkpoint_bytes(a.checkpoint, a.dtype)
    else:
        need = n_params(a.model) * (4 if a.dtype == "fp32" else 2)
    avail = mem_available_bytes()
    if avail is not None and need > 0.9 * avail and not a.force:
        print(f"hf_cpu_bench: {a.model or a.checkpoint} {a.dtype} weights need ~{need / 2**30:.1f} GiB, "
              f"only {avail / 2**30:.1f} GiB available (use --force to try anyway)", file=sys.stderr)
        return 1

    torch.manual_seed(a.seed)
    tb = time.perf_counter()
    if a.checkpoint:
        kw = {} if a.dtype == "auto" else {"dtype": DTYPES[a.dtype] or "float32"}
        model = AutoModelForCausalLM.from_pretrained(a.checkpoint, **kw).eval()
        source = f"AutoModelForCausalLM.from_pretrained(DIR{''.join(f', {k}={v!r}' for k, v in kw.items())})"
    else:
        model = AutoModelForCausalLM.from_config(opt_config(a.model, DTYPES.get(a.dtype))).eval()
        source = "AutoModelForCausalLM.from_config(OPTConfig(...))"
    build_s = time.perf_counter() - tb
    vocab = model.config.vocab_size

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(3, vocab, (a.batch, a.prompt_len), generator=g)
    mask = torch.ones_like(ids)
    warm = torch.randint(3, vocab, (a.batch, 8), generator=g)

    run_once(model, warm, torch.ones_like(warm), 2)
    runs = [run_once(model, ids, mask, a.gen_len) for _ in range(a.repeat)]

    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    res = {
        "system": "hf-transformers",
        "model": a.model or os.path.basename(os.path.normpath(a.checkpoint)),
        "checkpoint": a.checkpoint,
        "source": source,
        "dtype_arg": a.dtype,
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "batch": a.batch,
        "threads": torch.get_num_threads(),
        "threads_set": a.threads or None,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "prefill_s": round(med["prefill_s"], 6),
        "decode_s": round(med["decode_s"], 6),
        "total_s": round(med["total_s"], 6),
        "cpu_s": round(med["cpu_s"], 3),
        "throughput_tok_s": round(med["throughput_tok_s"], 4),
        "repeat": a.repeat,
        "runs": [{k: round(v, 6) for k, v in r.items()} for r in runs],
        "build_s": round(build_s, 3),
        "attn_implementation": model.config._attn_implementation,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "torch_blas": torch.__config__.show().split("BLAS_INFO=")[-1].split(",")[0]
        if "BLAS_INFO=" in torch.__config__.show() else None,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "loaded_blas_libs": loaded_blas_libs(),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                               "OMP_WAIT_POLICY", "OPENBLAS_CORETYPE",
                                               "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS")},
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"hf-transformers {res['model']} {res['dtype']} P={a.prompt_len} G={a.gen_len} "
              f"B={a.batch} threads={res['threads']}: prefill {res['prefill_s']:.3f} s, "
              f"decode {res['decode_s']:.3f} s, {res['throughput_tok_s']:.2f} tok/s "
              f"(cpu {res['cpu_s']:.1f} s; median of {a.repeat}; "
              f"attn={res['attn_implementation']}, torch {torch.__version__}, "
              f"transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
