#!/usr/bin/env python3
"""Generate golden fixtures for the LLaMA family from tiny random checkpoints
(Llama, Mistral, Qwen2), the sibling of tools/make_fixtures.py (OPT), whose
helpers it shares.  tests/test_llama_model.c runs them against these
goldens, tests/test_llama_fixtures.c checks their names, shapes and dtypes.

For every fixture in FIXTURES this writes tests/fixtures/<name>/ with

  config.json      written here in the form published checkpoints use
                   (rope_theta, rope_scaling, num_key_value_heads,
                   torch_dtype, ...), then read back by transformers,
                   which builds the reference model from it
  model*.safetensors  the weights in the storage dtype (fp16; bf16 for one),
                   one file or two shards with model.safetensors.index.json;
                   a tied head stores no lm_head.weight (as transformers
                   writes it)
  generation_config.json  bos / eos / pad ids
  golden.json      prompts, greedy continuations, their log-probabilities
                   and metadata: the fields of the OPT fixtures' golden.json,
                   plus greedy_logprobs and the shapes of every tensor
  logits.bin       little-endian float32 logits of one batched, left-padded
                   forward pass: for prompt i in order, its n_i real rows

Weights: random, scaled up as in make_fixtures.py (linear normal(0, gain /
sqrt(fan_in)), biases normal(0, 0.05), norm gains 1 + normal(0, 0.1), the
last norm's gain times readout_gain, token embeddings with log-normal row
scales), then rounded to values that fp16 and the storage dtype both hold
exactly (make_fixtures.round_param_), so a runtime keeping fp16 weights
sees the reference's weights bit for bit, bf16 checkpoint included.  The
reference runs in fp32, eval mode, eager attention, from the files on disk.

Positions: a left-padded row's positions start at 0 at its first real token
(transformers' generate derives them from the attention mask); the batched
forward for logits.bin passes them explicitly, and each prompt alone must
give the same logits and tokens.

Seeds seed0, seed0+1, ... are tried until the greedy continuations have a
top1-top2 logit gap >= MARGIN_TARGET at every step (batched and alone) and
are not degenerate.  No EOS rule: EOS (id 2) may or may not occur
(greedy_has_eos says).

Text fixtures (TEXT_FIXTURES: llama2-text, llama3-text, qwen2-text) also
carry a tokenizer, trained here with the `tokenizers` library on Debian's
license texts (tools/make_hf_tokenizer_fixture.py's trainers) with as many
entries as the model's vocab_size: tokenizer.json and tokenizer_config.json
of the Llama 2 kind (SentencePiece-style BPE with byte fallback,
add_bos_token), the Llama 3 kind (byte-level BPE with Llama 3's split
regex, <|begin_of_text|> from the post-processor, two end tokens) and the
Qwen2 kind (Qwen2's regex and NFC, no BOS).  Their prompts are texts;
golden.json adds `texts`, `prompts` (the ids `tokenizers` gives them with
add_special_tokens=True, checked equal to transformers' AutoTokenizer),
`bos_token_id` / `add_bos` (what the prompt starts with), `eos_token_ids`
(the config's end tokens, at any of which generation stops) and
`completions` (tokenizers' decode of each greedy continuation with
skip_special_tokens=True).  No logits.bin: their checks are the greedy
tokens and the text.

Usage: python3 tools/make_llama_fixtures.py [--out tests/fixtures] [--only NAME]
Needs torch, transformers and safetensors (tests/fixtures/README.md), and
tokenizers for the text fixtures.
"""

import argparse
import hashlib
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import make_fixtures as mf  # noqa: E402  (sets the thread and hub environment)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

PAD_ID = 0  # Llama's <unk>: these checkpoints have no pad token
BOS_ID = 1
EOS_ID = 2
FIRST_PROMPT_ID = 3

MARGIN_TARGET = 0.05
MARGIN_ASSERT = 0.01
MAX_SEED_TRIES = 200

# the shape every fixture shares unless it says otherwise
BASE = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
            intermediate_size=128, vocab_size=256, max_position_embeddings=128,
            rms_norm_eps=1e-6, hidden_act="silu")

FIXTURES = [
    dict(name="llama-gqa", model_type="llama",
         config=dict(BASE, num_key_value_heads=2, rope_theta=10000.0,
                     tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
         storage="fp16", layout="single", prompt_lens=[7, 3, 12, 1], new_tokens=24,
         seed0=5000),
    dict(name="llama3-rope", model_type="llama",
         # Llama 3.1's scaling with a short original context, so that the
         # fixture's positions fall in all three of its frequency bands
         config=dict(BASE, num_key_value_heads=1, rope_theta=500000.0,
                     rope_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64,
                                   "rope_type": "llama3"},
                     tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
         storage="bf16", layout="single", prompt_lens=[30, 5, 17], new_tokens=24,
         seed0=6000),
    dict(name="mistral", model_type="mistral",
         # sliding_window null, as Mistral-7B v0.2 and later ship
         config=dict(BASE, num_key_value_heads=2, rope_theta=1000000.0,
                     sliding_window=None, tie_word_embeddings=False),
         storage="fp16", layout="single", prompt_lens=[9, 4, 1], new_tokens=24,
         seed0=7000),
    dict(name="qwen2", model_type="qwen2",
         # q/k/v biases (always on in Qwen2), sharded like Qwen2-7B
         config=dict(BASE, num_key_value_heads=2, rope_theta=1000000.0,
                     use_sliding_window=False, sliding_window=None, max_window_layers=2,
                     tie_word_embeddings=False),
         storage="fp16", layout="sharded", prompt_lens=[6, 11, 2], new_tokens=24,
         seed0=8000),
    dict(name="llama-tied", model_type="llama",
         # tied head (as Llama 3.2 1B/3B), plain multi-head attention
         config=dict(BASE, num_key_value_heads=4, rope_theta=10000.0,
                     tie_word_embeddings=True, attention_bias=False, mlp_bias=False),
         storage="fp16", layout="single", prompt_lens=[8, 2, 5], new_tokens=24,
         seed0=9000),
]

# Checkpoints with a tokenizer: one layer (their point is the text path;
# the forward pass is the fixtures' above), a vocabulary of 512 (the
# tokenizer trained to exactly that many entries), prompts given as text.
TEXT_BASE = dict(BASE, num_hidden_layers=1, vocab_size=512)
TEXT_FIXTURES = [
    dict(name="llama2-text", model_type="llama", tokenizer="llama2",
         config=dict(TEXT_BASE, num_key_value_heads=2, rope_theta=10000.0,
                     tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
         storage="fp16", layout="single", new_tokens=24, seed0=11000, want_eos=True,
         texts=["The GNU General Public License is a free, copyleft license",
                "  two leading spaces,\ttabs\tand\nnew lines",
                "Z\u00fcrich caf\u00e9 na\u00efve \u2014 \u65e5\u672c\u8a9e \U0001F600 \u00bd",
                "123456 + 7.5 = ?"]),
    dict(name="llama3-text", model_type="llama", tokenizer="llama3",
         config=dict(TEXT_BASE, num_key_value_heads=1, rope_theta=500000.0,
                     tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
         storage="fp16", layout="single", new_tokens=24, seed0=12000, want_eos=True,
         texts=["Everyone is permitted to copy and distribute verbatim copies",
                "I'm sure they'll say it's fine, DON'T you think?",
                "Gr\u00f6\u00dfe: 12345 km\u00b2, \u4e2d\u6587 and \U0001F389\n\n",
                "x"]),
    dict(name="qwen2-text", model_type="qwen2", tokenizer="qwen2",
         config=dict(TEXT_BASE, num_key_value_heads=2, rope_theta=1000000.0,
                     use_sliding_window=False, sliding_window=None, max_window_layers=1,
                     tie_word_embeddings=False),
         storage="fp16", layout="single", new_tokens=24, seed0=13000, want_eos=True,
         texts=["<|im_start|>user\nWhat does the license permit?<|im_end|>\n<|im_start|>assistant\n",
                "Numbers 2024 and 3.14159 split into digits",
                "e\u0301 composed by NFC: cafe\u0301, A\u030a",
                "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac, \u0420\u0443\u0441\u0441\u043a\u0438\u0439"]),
]

ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM"}
INIT = dict(emb_std=0.3, row_lognorm=0.3, lin_gain=1.5, readout_gain=3.0)
DTYPE_NAME = {"fp16": "float16", "bf16": "bfloat16"}
TORCH_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------
# config and weights
# --------------------------------------------------------------------------

def hub_config(spec):
    """config.json as published checkpoints write it."""
    c = dict(spec["config"])
    c.update(model_type=spec["model_type"], architectures=[ARCH[spec["model_type"]]],
             bos_token_id=spec.get("config_bos_id", BOS_ID), eos_token_id=spec.get("eos_id", EOS_ID),
             initializer_range=0.02,
             attention_dropout=0.0, use_cache=True, torch_dtype=DTYPE_NAME[spec["storage"]])
    return dict(sorted(c.items()))


def load_config(outdir):
    cfg = AutoConfig.from_pretrained(outdir)
    cfg._attn_implementation = "eager"
    return cfg


def init_weights_(model, spec, gen):
    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        shape = tuple(p.shape)
        if name.endswith("embed_tokens.weight"):
            w = normal(shape, INIT["emb_std"])
            w *= torch.exp(normal((shape[0], 1), INIT["row_lognorm"]))
        elif "norm" in name:  # RMSNorm gains
            w = 1.0 + normal(shape, 0.1)
        elif name.endswith(".weight"):  # nn.Linear [out, in]
            w = normal(shape, INIT["lin_gain"] / shape[1] ** 0.5)
        elif name.endswith(".bias"):
            w = normal(shape, 0.05)
        else:
            raise RuntimeError(f"unexpected parameter {name}")
        p.data.copy_(w)
    model.model.norm.weight.data *= INIT["readout_gain"]


def make_model(spec, cfg, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == spec["config"]["tie_word_embeddings"], spec["name"]
    init_weights_(model, spec, torch.Generator().manual_seed(seed))
    for p in model.parameters():
        mf.round_param_(p, spec["storage"])
    return model.float().eval()


def tensors_to_write(model, spec):
    """The state dict as a checkpoint holds it: the storage dtype, no
    lm_head.weight where the head is tied."""
    dt = TORCH_DTYPE[spec["storage"]]
    sd = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and spec["config"]["tie_word_embeddings"]:
            continue
        sd[k] = v.detach().to(dt).contiguous().clone()
    return sd


def write_weights(sd, spec, outdir):
    if spec["layout"] == "single":
        save_file(sd, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
        return
    assert spec["layout"] == "sharded"
    # layers of the first half (and the embedding) in shard 1, the rest in 2
    split = spec["config"]["num_hidden_layers"] // 2

    def shard_of(k):
        if k.startswith("model.layers."):
            return 1 if int(k.split(".")[2]) < split else 2
        return 1 if k.startswith("model.embed_tokens") else 2

    names = {1: "model-00001-of-00002.safetensors", 2: "model-00002-of-00002.safetensors"}
    weight_map, total = {}, 0
    for s in (1, 2):
        part = {k: v for k, v in sorted(sd.items()) if shard_of(k) == s}
        save_file(part, os.path.join(outdir, names[s]), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = names[s]
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------
# reference computations
# --------------------------------------------------------------------------

def special_ids(spec):
    """(pad id, end tokens) of a fixture: a text fixture's come from its
    tokenizer (set by make_tokenizer), the others' are Llama 2's."""
    eos = spec.get("eos_id", EOS_ID)
    return spec.get("pad_id", PAD_ID), tuple(eos) if isinstance(eos, list) else (eos,)


def cut_at_eos(tokens, eos):
    out = []
    for t in tokens:
        out.append(int(t))
        if t in eos:
            break
    return out


def make_prompts(spec, seed):
    if "prompt_ids" in spec:  # a text fixture: the tokenizer's ids
        return [list(p) for p in spec["prompt_ids"]]
    g = torch.Generator().manual_seed(seed + 7919)
    V = spec["config"]["vocab_size"]
    return [torch.randint(FIRST_PROMPT_ID, V, (n,), generator=g).tolist()
            for n in spec["prompt_lens"]]


def left_pad(prompts, pad=PAD_ID):
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), T), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):] = torch.tensor(p)
        mask[i, T - len(p):] = 1
    return ids, mask


@torch.no_grad()
def greedy(model, prompts, n_new, spec):
    """Batched greedy generate: (token lists cut at EOS, their log-probs,
    min top1-top2 margin of each sequence)."""
    pad, eos = special_ids(spec)
    ids, mask = left_pad(prompts, pad)
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False,
        max_new_tokens=n_new, min_new_tokens=0, pad_token_id=pad,
        eos_token_id=list(eos), return_dict_in_generate=True, output_logits=True,
        num_beams=1, repetition_penalty=None, top_k=None, top_p=None, temperature=None,
    )
    new = out.sequences[:, ids.shape[1]:]
    toks, lps, mins = [], [], []
    for b in range(len(prompts)):
        t = cut_at_eos(new[b].tolist(), eos)
        toks.append(t)
        lp = []
        for s in range(len(t)):
            row = out.logits[s][b].float()
            assert int(row.argmax()) == t[s]
            lp.append(float(torch.log_softmax(row, -1)[t[s]]))
        lps.append(lp)
        mins.append(min(mf.margins(out.logits[s][b:b + 1]).item() for s in range(len(t))))
    return toks, lps, mins


@torch.no_grad()
def batched_logits(model, prompts, pad=PAD_ID):
    ids, mask = left_pad(prompts, pad)
    T = ids.shape[1]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    return [logits[i, T - len(p):, :] for i, p in enumerate(prompts)]


def try_seed(spec, cfg, seed):
    N = spec["new_tokens"]
    model = make_model(spec, cfg, seed)
    prompts = make_prompts(spec, seed)
    toks, lps, mins = greedy(model, prompts, N, spec)
    if not mf.distinct_ok(toks) or min(mins) < MARGIN_TARGET:
        return None
    # a text fixture has a sequence stop at an end token (finish_reason
    # "stop", the token dropped from the completion)
    if spec.get("want_eos") and not any(t[-1] in special_ids(spec)[1] for t in toks):
        return None
    all_mins = list(mins)
    for i, p in enumerate(prompts):  # each prompt alone gives the same tokens
        t1, _, m1 = greedy(model, [p], N, spec)
        assert t1[0] == toks[i], (spec["name"], seed, i, t1[0], toks[i])
        all_mins.extend(m1)
    if min(all_mins) < MARGIN_TARGET:
        return None
    return model, prompts, dict(greedy=toks, logprobs=lps, min_margin=min(all_mins))


def search(spec, cfg):
    for k in range(MAX_SEED_TRIES):
        got = try_seed(spec, cfg, spec["seed0"] + k)
        if got is not None:
            return (spec["seed0"] + k, k + 1) + got
    raise SystemExit(f"{spec['name']}: no seed met the constraints")


# --------------------------------------------------------------------------
# tokenizers (text fixtures)
# --------------------------------------------------------------------------

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tokenizer(spec, outdir):
    """Train spec's tokenizer to the model's vocab_size, write tokenizer.json
    and tokenizer_config.json into outdir, and set the spec's special ids
    and prompt ids from it."""
    import tokenizers
    import make_hf_tokenizer_fixture as hft
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    texts = hft.corpus()
    V = spec["config"]["vocab_size"]
    kind = spec["tokenizer"]
    if kind == "llama2":
        # <unk> <s> </s> at 0 1 2, the byte tokens, the merges
        tok = hft.spm_llama2(hft.spm_model(texts, V))
        tcfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
                "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
                "clean_up_tokenization_spaces": False, "legacy": False,
                "tokenizer_class": "LlamaTokenizer"}
        bos, eos, pad = "<s>", ["</s>"], "<unk>"
    elif kind == "llama3":
        # the special tokens after the BPE's entries, as Llama 3 has them;
        # BOS from the post-processor's template; Llama 3.1's two end tokens
        tok = hft.byte_level(texts, hft.LLAMA3_RE, True, LLAMA3_SPECIALS, LLAMA3_SPECIALS[0],
                             vocab_size=V - len(LLAMA3_SPECIALS))
        tcfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                "clean_up_tokenization_spaces": False,
                "tokenizer_class": "PreTrainedTokenizerFast"}
        bos, eos, pad = "<|begin_of_text|>", ["<|end_of_text|>", "<|eot_id|>"], "<|end_of_text|>"
    elif kind == "qwen2":
        tok = hft.byte_level(texts, hft.QWEN2_RE, False, QWEN2_SPECIALS, None, nfc=True,
                             vocab_size=V - len(QWEN2_SPECIALS))
        tcfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                "clean_up_tokenization_spaces": False, "split_special_tokens": False,
                "tokenizer_class": "Qwen2Tokenizer"}
        bos, eos, pad = None, ["<|endoftext|>"], "<|endoftext|>"
    else:
        raise SystemExit(f"{spec['name']}: unknown tokenizer kind {kind}")
    assert tok.get_vocab_size(with_added_tokens=True) == V, (kind, tok.get_vocab_size())
    tok.save(os.path.join(outdir, "tokenizer.json"), pretty=False)
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=1)
        f.write("\n")

    tok = tokenizers.Tokenizer.from_file(os.path.join(outdir, "tokenizer.json"))
    ids = [tok.encode(t, add_special_tokens=True).ids for t in spec["texts"]]
    # transformers reading tokenizer.json as it is gives the same ids;
    # AutoTokenizer may not: transformers 5's LlamaTokenizer replaces the
    # file's normalizer by its own Metaspace pre-tokenizer, which encodes
    # leading spaces otherwise.  Recorded (golden autotokenizer_ids, null
    # where it agrees), not followed: sluice reads the file as tokenizers does
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(outdir, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(outdir)
    spec["auto_ids"], spec["auto_class"] = [], type(auto).__name__
    for t, i in zip(spec["texts"], ids):
        assert fast(t, add_special_tokens=False)["input_ids"] == (i[1:] if bos else i), (t, i)
        a = auto(t)["input_ids"]
        spec["auto_ids"].append(None if a == i else a)
        if a != i:
            print(f"[{spec['name']}] note: {type(auto).__name__} gives {a} for {t!r}, "
                  f"tokenizers {i}")
    bos_id = tok.token_to_id(bos) if bos else None
    for i in ids:
        assert (i[0] == bos_id) == (bos is not None), (spec["name"], i)
        assert max(i) < V and len(i) <= 64, (spec["name"], i)
    spec["prompt_ids"] = ids
    spec["bos_id"] = bos_id
    # config.json's bos_token_id: Qwen2's names <|endoftext|>, which its
    # tokenizer never adds
    spec["config_bos_id"] = bos_id if bos else tok.token_to_id(eos[0])
    eos_ids = [tok.token_to_id(e) for e in eos]
    spec["eos_id"] = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    spec["pad_id"] = tok.token_to_id(pad)
    return tok


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------

@torch.no_grad()
def write_fixture(spec, outroot):
    t0 = time.time()
    name = spec["name"]
    outdir = os.path.join(outroot, name)
    os.makedirs(outdir, exist_ok=True)
    for f in os.listdir(outdir):  # stale files from an older layout
        os.remove(os.path.join(outdir, f))
    tok = make_tokenizer(spec, outdir) if "tokenizer" in spec else None
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(hub_config(spec), f, indent=2)
        f.write("\n")
    cfg = load_config(outdir)  # transformers reads the published form
    if spec["config"].get("rope_scaling"):
        rs = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
        assert rs and rs.get("rope_type") == "llama3", (name, rs)

    seed, tries, model, prompts, res = search(spec, cfg)
    sd = tensors_to_write(model, spec)
    write_weights(sd, spec, outdir)
    model.generation_config.pad_token_id = special_ids(spec)[0]
    model.generation_config.save_pretrained(outdir)

    # the reference is the checkpoint as transformers loads it from disk
    ref = AutoModelForCausalLM.from_pretrained(outdir, dtype=torch.float32,
                                               attn_implementation="eager").eval()
    for k, v in model.state_dict().items():
        assert torch.equal(ref.state_dict()[k], v), f"{name}: {k} differs after reload"
    toks, lps, _ = greedy(ref, prompts, spec["new_tokens"], spec)
    assert toks == res["greedy"], name
    rows = batched_logits(ref, prompts, special_ids(spec)[0])
    for i, p in enumerate(prompts):
        single = ref(input_ids=torch.tensor([p])).logits[0]
        assert torch.allclose(single, rows[i], atol=1e-4, rtol=1e-4), (name, i)
        assert rows[i].shape == (len(p), spec["config"]["vocab_size"])
    assert all(len(p) + spec["new_tokens"] <= spec["config"]["max_position_embeddings"]
               for p in prompts)
    logits = torch.cat(rows, 0).contiguous().numpy().astype("<f4")
    if tok is None:  # the text fixtures are checked by their tokens and text
        logits.tofile(os.path.join(outdir, "logits.bin"))

    assert res["min_margin"] > MARGIN_ASSERT, res["min_margin"]
    tensors = {k: {"dtype": {torch.float16: "F16", torch.bfloat16: "BF16"}[v.dtype],
                   "shape": list(v.shape)} for k, v in sorted(sd.items())}
    golden = {
        "model_type": spec["model_type"],
        "prompts": prompts,
        "pad_left_to": max(len(p) for p in prompts),
        "pad_token_id": special_ids(spec)[0],
        "eos_token_id": special_ids(spec)[1][0],
        **({} if tok else {"logits_file": "logits.bin", "logits_dtype": "float32-le",
                           "logits_rows": [len(p) for p in prompts]}),
        "vocab_size": spec["config"]["vocab_size"],
        "greedy_new_tokens": spec["new_tokens"],
        "greedy": res["greedy"],
        "greedy_logprobs": [[round(x, 6) for x in lp] for lp in lps],
        "greedy_min_margin": round(res["min_margin"], 6),
        "greedy_has_eos": [bool(t and t[-1] in special_ids(spec)[1]) for t in res["greedy"]],
        "weights_dtype": spec["storage"],
        "weights_layout": spec["layout"],
        "tie_word_embeddings": spec["config"]["tie_word_embeddings"],
        "tensors": tensors,
        "seed": seed,
        "logits_absmax": round(float(np.abs(logits).max()), 4),
        "hf_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
    }
    if tok:
        golden.update(
            tokenizer_kind=spec["tokenizer"],
            texts=spec["texts"],
            add_bos=spec["bos_id"] is not None,
            bos_token_id=spec["bos_id"],
            eos_token_ids=list(special_ids(spec)[1]),
            completions=[tok.decode(t, skip_special_tokens=True) for t in res["greedy"]],
            autotokenizer_class=spec["auto_class"],
            autotokenizer_ids=spec["auto_ids"],
            tokenizers_version=tok_version())
    with open(os.path.join(outdir, "golden.json"), "w") as f:
        f.write(mf.dump_json(golden))

    files = sorted(os.listdir(outdir))
    sizes = {f: os.path.getsize(os.path.join(outdir, f)) for f in files}
    total = sum(sizes.values())
    h = hashlib.sha256()
    for f in files:
        with open(os.path.join(outdir, f), "rb") as fh:
            h.update(f.encode() + b"\0" + fh.read())
    print(f"[{name}] seed={seed} tries={tries} prompts={[len(p) for p in prompts]} "
          f"min_margin={res['min_margin']:.4f} logit_absmax={golden['logits_absmax']} "
          f"eos={golden['greedy_has_eos']} new_lens={[len(t) for t in res['greedy']]} "
          f"total={total} B sha256={h.hexdigest()[:16]} ({time.time() - t0:.1f}s)")
    for f in files:
        print(f"    {f:40s} {sizes[f]:>9d} B")
    return total


def tok_version():
    import tokenizers
    return tokenizers.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    ap.add_argument("--only", action="append", help="fixture name (repeatable)")
    args = ap.parse_args()
    t0 = time.time()
    total = 0
    for spec in FIXTURES + TEXT_FIXTURES:
        if args.only and spec["name"] not in args.only:
            continue
        total += write_fixture(spec, os.path.normpath(args.out))
    print(f"total {total} B in {time.time() - t0:.1f}s "
          f"(transformers {transformers.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    sys.exit(main())
