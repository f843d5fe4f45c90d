#!/usr/bin/env python3
"""train_model.py - train sluice's bundled default model, a tiny OPT trained
on the King James Bible, end to end on the CPU.

Remake the bundled models/opt-tiny-kjv exactly (same torch, same kind of
CPU; about 30 minutes on 2 cores) with one command, from the repository root:

    apt-get install -y bible-kjv && nice -n 10 python3 tools/train_model.py --steps 731

or train to a time budget instead (the step count is then fitted to the
machine's speed and printed; `--steps N` repeats that schedule):

    nice -n 10 python3 tools/train_model.py --minutes 36

Corpus: the King James Version (1611) of the Bible, as shipped by Debian's
`bible-kjv-text` package (source package `bible-kjv`, version 4.38 in
Debian 12/13; 4.4 MB, 31,102 verses).  The text is dumped with the `bible`
program of the `bible-kjv` package (`bible -f Gen1:1-Rev22:21`, one verse per
line after its reference).  Licence: the KJV text is in the public domain
(Debian's copyright file: "The copyright for the King James Version text of
the Bible is expired since the translation was done in 1611"); the
compressed data file is "provided for unrestricted use ... Users may copy,
modify or distribute this file at will" (Chip Chapin, 1989).  The `bible`
program itself is GPL-2+, but only its output (the public-domain text) is
used here.

Pipeline (all seeded; needs python3 with torch, transformers, tokenizers,
safetensors):
  1. corpus   verses without their references, one verse a line, a blank
              line between chapters.  The last whole books making up >= 5%
              of the text (Colossians .. Revelation) are held out: never seen
              by the tokenizer trainer nor the model.
  2. tokenizer  Hugging Face `tokenizers` ByteLevelBPETokenizer (GPT-2 style,
              add_prefix_space=False), special tokens <s>=0 <pad>=1 </s>=2
              <unk>=3 as in OPT, trained on the training part only; saved as
              vocab.json + merges.txt (+ tokenizer_config.json /
              special_tokens_map.json so transformers' AutoTokenizer loads it
              as OPT's GPT2Tokenizer: bos = eos = </s>, pad = <pad>).
  3. model    transformers OPTForCausalLM: pre-LN, relu, biases, tied
              embeddings.  Training windows of --seq tokens start with </s>
              (id 2, as OPT's tokenizer prepends) followed by text that starts
              at a random verse.  AdamW, linear warm-up then cosine decay.
              With --minutes (the training loop's budget; tokenizer, final
              evaluation and samples add about 2 minutes) the step count is
              fitted to the budget after 30 steps and re-fitted at each
              evaluation until 60% of the way, as the speed of a shared
              machine changes; the run prints the step count it ended with,
              and `--steps N` repeats a schedule exactly.
  4. evaluate  loss per token on packed whole-verse windows (each starting
              with </s>, padding ignored) of the held-out part, and of an
              equally sized sample of the training part.
  5. save     models/<name>/: config.json, model.safetensors (fp16),
              vocab.json, merges.txt, tokenizer configs, heldout.txt (the
              first ~190 KB of the held-out text), README.md with the
              numbers and greedy / sampled continuations made with
              transformers' generate() from the saved fp16 files.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3, as in OPT
BOS = 2  # OPT: bos = eos = </s>
PAD = 1

# the bible program's book abbreviations (in order) and the books' names
BOOKS = dict(zip(
    "Ge Exo Lev Num Deu Josh Jdgs Ruth 1Sm 2Sm 1Ki 2Ki 1Chr 2Chr Ezra Neh Est Job Psa Prv "
    "Eccl SSol Isa Jer Lam Eze Dan Hos Joel Amos Obad Jonah Mic Nahum Hab Zep Hag Zec Mal "
    "Mat Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phi Col 1Th 2Th 1Tim 2Tim Titus Phmn Heb "
    "Jas 1Pet 2Pet 1Jn 2Jn 3Jn Jude Rev".split(),
    ["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
     "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
     "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
     "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
     "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
     "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
     "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
     "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon",
     "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude",
     "Revelation"]))

PROMPTS = [
    "In the beginning",
    "And it came to pass, when the king",
    "Blessed are they that",
    "The LORD is my shepherd;",
    "And Jesus said unto them,",
]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- corpus
def dump_kjv():
    """[(book, chapter, verse, text)] from the bible-kjv package."""
    exe = shutil.which("bible")
    if not exe:
        sys.exit("train_model.py: the `bible` program is missing: "
                 "apt-get install -y bible-kjv (Debian package, brings bible-kjv-text)")
    out = subprocess.run([exe, "-f", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, check=True).stdout
    verses = []
    pat = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
    for line in out.splitlines():
        m = pat.match(line)
        if not m:
            sys.exit(f"train_model.py: unexpected line from bible: {line[:80]!r}")
        text = " ".join(m.group(4).split())
        verses.append((m.group(1), int(m.group(2)), int(m.group(3)), text))
    if len(verses) != 31102:
        sys.exit(f"train_model.py: expected 31102 verses, got {len(verses)}")
    return verses


def verses_to_lines(verses):
    """One line per verse; the last verse of a chapter gets an extra newline
    (blank line between chapters).  Returns the lines, each ending in \\n."""
    lines = []
    for i, (b, c, v, t) in enumerate(verses):
        end_ch = i + 1 == len(verses) or verses[i + 1][:2] != (b, c)
        lines.append(t + ("\n\n" if end_ch else "\n"))
    return lines


def split_heldout(verses, frac):
    """Hold out the smallest suffix of whole books with >= frac of the bytes."""
    total = sum(len(t) + 1 for *_, t in verses)
    books = []
    for i, (b, *_rest) in enumerate(verses):
        if not books or books[-1][0] != b:
            books.append((b, i))
    acc = 0
    for b, start in reversed(books):
        acc = sum(len(t) + 1 for *_, t in verses[start:])
        if acc >= frac * total:
            return verses[:start], verses[start:], BOOKS.get(b, b)
    raise AssertionError


# ---------------------------------------------------------------- tokenizer
def train_tokenizer(lines, vocab_size, outdir):
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer(add_prefix_space=False)
    tok.train_from_iterator(lines, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=SPECIALS, show_progress=False)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.save_model(outdir)
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "add_bos_token": True,
                   "add_prefix_space": False, "errors": "replace",
                   "bos_token": "</s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "pad_token": "<pad>", "model_max_length": 512}, f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": "</s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "pad_token": "<pad>"}, f, indent=2)
        f.write("\n")
    return tok


def encode_lines(tok, lines):
    """Token stream of all lines and the offset where each line starts."""
    encs = tok.encode_batch(lines)
    starts, ids = [], []
    for e in encs:
        starts.append(len(ids))
        ids.extend(e.ids)
    return np.array(ids, dtype=np.int64), np.array(starts, dtype=np.int64)


def packed_windows(ids, starts, seq):
    """Whole verses packed greedily into windows of seq tokens, each
    starting with </s>; returns (input [N,seq], mask [N,seq]).  A verse
    longer than seq-1 tokens is cut (none is, at seq >= 128)."""
    bounds = list(starts) + [len(ids)]
    rows, cur = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        v = ids[a:b].tolist()[: seq - 1]
        if len(cur) + len(v) > seq - 1:
            rows.append(cur)
            cur = []
        cur = cur + v
    if cur:
        rows.append(cur)
    x = np.full((len(rows), seq), PAD, dtype=np.int64)
    m = np.zeros((len(rows), seq), dtype=np.int64)
    for i, r in enumerate(rows):
        x[i, 0] = BOS
        x[i, 1:1 + len(r)] = r
        m[i, :1 + len(r)] = 1
    return torch.from_numpy(x), torch.from_numpy(m)


# ---------------------------------------------------------------- model
def make_model(args, vocab_size):
    from transformers import OPTConfig, OPTForCausalLM
    cfg = OPTConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, num_hidden_layers=args.layers,
        ffn_dim=4 * args.hidden, num_attention_heads=args.heads,
        max_position_embeddings=args.max_pos, word_embed_proj_dim=args.hidden,
        do_layer_norm_before=True, activation_function="relu", enable_bias=True,
        layer_norm_elementwise_affine=True, dropout=args.dropout, attention_dropout=0.0,
        activation_dropout=0.0, layerdrop=0.0, init_std=0.02,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=BOS,
        tie_word_embeddings=True, use_cache=True)
    torch.manual_seed(args.seed)
    model = OPTForCausalLM(cfg)
    model.tie_weights()
    return model


def lm_loss(model, x, mask):
    """Mean next-token cross-entropy over the positions whose target is real."""
    logits = model(input_ids=x, attention_mask=mask).logits[:, :-1].float()
    tgt = x[:, 1:]
    tm = mask[:, 1:].bool()
    loss = torch.nn.functional.cross_entropy(logits[tm], tgt[tm], reduction="sum")
    return loss, int(tm.sum())


@torch.no_grad()
def evaluate(model, x, mask, bs=32, autocast=False):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(x), bs):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, k = lm_loss(model, x[i:i + bs], mask[i:i + bs])
        tot += float(loss)
        n += k
    model.train()
    return tot / n


def train(model, args, ids, starts, ev):
    g = torch.Generator().manual_seed(args.seed + 1)
    # windows start at a verse start whose window fits in the token stream
    ok = starts[starts + args.seq - 1 <= len(ids)]
    ids_t = torch.from_numpy(ids)
    ok_t = torch.from_numpy(ok)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    ar = torch.arange(args.seq - 1)

    def batch():
        s = ok_t[torch.randint(len(ok_t), (args.batch,), generator=g)]
        x = torch.empty((args.batch, args.seq), dtype=torch.long)
        x[:, 0] = BOS
        x[:, 1:] = ids_t[s[:, None] + ar[None, :]]
        return x

    total = args.steps  # None: fixed by calibration against --minutes
    budget = args.minutes * 60.0
    t0 = time.time()
    t_eval = 0.0
    hist = []

    def do_eval(step):
        nonlocal t_eval
        te = time.time()
        tr = evaluate(model, *ev["train_small"], autocast=args.bf16)
        he = evaluate(model, *ev["held_small"], autocast=args.bf16)
        t_eval += time.time() - te
        el = time.time() - t0
        log(f"step {step:5d}/{total or '?'}  {el / 60:6.2f} min  train {tr:.4f} (ppl {math.exp(tr):8.2f})"
            f"  held-out {he:.4f} (ppl {math.exp(he):8.2f})  lr {opt.param_groups[0]['lr']:.2e}")
        hist.append((step, el, tr, he))

    do_eval(0)
    calib_at = 30
    adaptive = total is None  # --minutes: step count fitted to the budget
    eval_every = None if total is None else max(1, total // args.evals)
    step = 0
    tok_seen = 0
    run_loss = None

    def fit_total():
        """Steps that fit the rest of the budget at the average speed so far,
        with a 5% margin and room for the evaluations still to come."""
        el = time.time() - t0
        per = (el - t_eval) / step
        per_eval = t_eval / len(hist)
        evals_left = max(1, args.evals + 1 - len(hist))
        left = budget - el - 45.0 - evals_left * per_eval
        return max(step + 1, step + int(left / (1.05 * per))), per

    while True:
        if total is not None and step >= total:
            break
        if adaptive and step == calib_at:
            total, per = fit_total()
            eval_every = max(1, total // args.evals)
            log(f"calibrated: {per:.3f} s/step, {args.batch * args.seq / per:.0f} tokens/s"
                f" -> total steps {total}")
        if total is not None and time.time() - t0 > budget * 1.1:
            log(f"time budget overrun, stopping at step {step}")
            break
        # lr: linear warm-up, cosine to 10% of peak over the total steps
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            T = total if total is not None else 10 ** 9
            p = min(1.0, (step - args.warmup) / max(1, T - args.warmup))
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        x = batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(input_ids=x).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tok_seen += x.numel()
        lv = loss.item()
        run_loss = lv if run_loss is None else 0.95 * run_loss + 0.05 * lv
        if step % 10 == 0 and args.verbose:
            log(f"  step {step} loss {run_loss:.4f}")
        if (eval_every and step > calib_at and step % eval_every == 0
                and total - step > eval_every // 2):
            do_eval(step)
            # re-fit the step count to the machine's speed until 60% of the way
            # (the machine is shared; its speed changes); the cosine follows
            if adaptive and step < 0.6 * total:
                new, per = fit_total()
                if abs(new - total) > 0.02 * total:
                    log(f"re-fitted: {per:.3f} s/step on average -> total steps {total} -> {new}")
                    total = new
    train_s = time.time() - t0
    log(f"trained {step} steps in {train_s / 60:.1f} min (repeat this schedule exactly with --steps {step}"
        f"{'' if not adaptive else ', unless the step count was re-fitted above'})")
    if not hist or hist[-1][0] != step:
        do_eval(step)
    return {"steps": step, "train_seconds": train_s, "tokens_seen": tok_seen, "history": hist}


# ---------------------------------------------------------------- samples
def samples(outdir, seed):
    """Continuations made with transformers from the saved files."""
    from transformers import AutoTokenizer, OPTForCausalLM
    tok = AutoTokenizer.from_pretrained(outdir, use_fast=False)
    model = OPTForCausalLM.from_pretrained(outdir, torch_dtype=torch.float32)
    model.eval()
    res = []
    for i, p in enumerate(PROMPTS):
        enc = tok(p, return_tensors="pt")
        assert int(enc.input_ids[0, 0]) == BOS
        with torch.no_grad():
            gr = model.generate(**enc, max_new_tokens=40, do_sample=False,
                                pad_token_id=PAD)
            torch.manual_seed(seed + i)
            sa = model.generate(**enc, max_new_tokens=40, do_sample=True, top_k=40,
                                temperature=0.8, pad_token_id=PAD)
        n = enc.input_ids.shape[1]
        res.append({"prompt": p, "prompt_ids": enc.input_ids[0].tolist(),
                    "greedy": tok.decode(gr[0, n:], skip_special_tokens=True),
                    "sampled": tok.decode(sa[0, n:], skip_special_tokens=True)})
    return res


def write_readme(outdir, info):
    a = info["args"]
    r = []
    r.append(f"# {os.path.basename(outdir)}\n")
    r.append("A tiny OPT-architecture language model trained from scratch on the King James\n"
             "Bible, on two CPU cores, by `tools/train_model.py`. It is sluice's bundled\n"
             "default model and the real model used to measure H2O KV-cache eviction quality\n"
             "(`heldout.txt` is text it never saw in training).\n")
    r.append("## Remake\n")
    r.append("```sh\napt-get install -y bible-kjv\n"
             f"nice -n 10 python3 tools/train_model.py --steps {info['steps']}"
             f"   # exactly these weights (or --minutes {a['minutes']:g}: to a time budget)\n```\n")
    r.append("## Corpus and licence\n")
    r.append(f"- King James Version (1611) of the Bible from Debian's `bible-kjv-text` package\n"
             f"  (source `bible-kjv`, version {info['pkg_version']}), dumped with the `bible` program of\n"
             f"  package `bible-kjv`: `bible -f Gen1:1-Rev22:21`; references stripped, one verse a\n"
             f"  line, a blank line between chapters ({info['corpus_bytes']:,} bytes, 31,102 verses).\n"
             "- Licence: public domain. Debian's copyright file: \"The copyright for the King\n"
             "  James Version text of the Bible is expired since the translation was done in\n"
             "  1611\"; the data file is \"provided for unrestricted use ... Users may copy,\n"
             "  modify or distribute this file at will\" (Chip Chapin, 1989).\n"
             f"- Held out (never trained on, nor seen by the tokenizer trainer): the last books,\n"
             f"  {info['heldout_first_book']} through Revelation: {info['heldout_bytes']:,} bytes"
             f" ({100 * info['heldout_bytes'] / info['corpus_bytes']:.1f}%), {info['heldout_tokens']:,} tokens.\n"
             f"  `heldout.txt` is its first {info['heldout_file_bytes']:,} bytes (whole verses).\n")
    r.append("## Tokenizer\n")
    r.append(f"Byte-level BPE (GPT-2 style, `add_prefix_space=False`) trained with Hugging Face\n"
             f"`tokenizers` {info['versions']['tokenizers']} on the training part, vocabulary {info['vocab_size']}"
             f" (min frequency 2);\nspecial tokens `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3 as in OPT"
             f" (bos = eos = `</s>` = 2, pad = 1).\nFiles: `vocab.json`, `merges.txt` (GPT-2 format; "
             f"transformers' `GPT2Tokenizer` loads them, and\n`AutoTokenizer.from_pretrained(dir)` gives "
             f"OPT's behaviour: `</s>` prepended).\nTraining text: {info['train_tokens']:,} tokens"
             f" ({info['corpus_bytes'] - info['heldout_bytes']:,} bytes, "
             f"{(info['corpus_bytes'] - info['heldout_bytes']) / info['train_tokens']:.2f} bytes/token).\n")
    r.append("## Model\n")
    r.append(f"`OPTForCausalLM` (transformers {info['versions']['transformers']}): {a['layers']} layers, hidden {a['hidden']},\n"
             f"{a['heads']} heads (head dim {a['hidden'] // a['heads']}), ffn {4 * a['hidden']}, "
             f"max_position_embeddings {a['max_pos']}, vocab {info['vocab_size']},\n"
             "pre-LN (`do_layer_norm_before`), relu, biases, tied input/output embeddings.\n"
             f"{info['params']:,} parameters; stored as fp16 `model.safetensors` "
             f"({info['st_bytes']:,} bytes); folder {info['folder_bytes']:,} bytes.\n")
    r.append("## Training\n")
    r.append(f"torch {info['versions']['torch']}, CPU, {a['threads']} threads"
             f"{', bf16 autocast' if a['bf16'] else ', fp32'}; seed {a['seed']}. Windows of {a['seq']} tokens\n"
             f"(`</s>` then text from a random verse start), batch {a['batch']}; AdamW (betas 0.9/0.95,\n"
             f"weight decay {a['wd']}), peak lr {a['lr']}, {a['warmup']} warm-up steps, cosine to 10%;"
             f" grad clip 1.0;\ndropout {a['dropout']}. {info['steps']} steps,"
             f" {info['tokens_seen']:,} tokens seen ({info['tokens_seen'] / info['train_tokens']:.1f} epochs),"
             f" {info['train_seconds'] / 60:.1f} minutes wall time\n(training loop; whole script "
             f"{info['total_seconds'] / 60:.1f} minutes).\n")
    r.append("## Results\n")
    r.append("Loss per token (nats) on windows of whole verses packed to "
             f"{a['seq']} tokens, each starting with `</s>`,\nevaluated on the saved fp16 weights:\n")
    r.append("| part | tokens | loss | perplexity |\n|---|---|---|---|")
    r.append(f"| train (sample) | {info['train_eval_tokens']:,} | {info['final_train']:.4f} | {math.exp(info['final_train']):.2f} |")
    r.append(f"| held-out (all) | {info['heldout_tokens']:,} | {info['final_held']:.4f} | {math.exp(info['final_held']):.2f} |")
    r.append(f"| held-out, `heldout.txt` only | {info['heldout_file_tokens']:,} | {info['final_held_file']:.4f} | {math.exp(info['final_held_file']):.2f} |\n")
    r.append("Learning curve (fixed subsets):\n")
    r.append("| step | minutes | train loss | held-out loss |\n|---|---|---|---|")
    for s, el, tr, he in info["history"]:
        r.append(f"| {s} | {el / 60:.1f} | {tr:.3f} | {he:.3f} |")
    r.append("")
    r.append("## Samples\n")
    r.append("Made by transformers' `generate()` from the saved files, 40 new tokens; greedy, and\n"
             "sampled (top-k 40, temperature 0.8, `torch.manual_seed` fixed per prompt). The\n"
             "prompt is in bold; ` / ` marks a line break (a new verse):\n")
    for s in info["samples"]:
        r.append(f"Prompt ids (`</s>` prepended): {s['prompt_ids']}\n")
        for k in ("greedy", "sampled"):
            r.append(f"- {k}: **{s['prompt']}**{s[k].replace(chr(10), ' / ')}")
        r.append("")
    with open(os.path.join(outdir, "README.md"), "w") as f:
        f.write("\n".join(r).rstrip() + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="output folder (default models/opt-tiny-kjv)")
    ap.add_argument("--minutes", type=float, default=40.0, help="training time budget")
    ap.add_argument("--steps", type=int, default=None, help="fixed step count (overrides --minutes)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--evals", type=int, default=10, help="evaluations during training")
    ap.add_argument("--heldout-frac", type=float, default=0.05)
    ap.add_argument("--heldout-file-bytes", type=int, default=190_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="bf16 autocast for the matmuls (weights and optimizer stay fp32)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    t_start = time.time()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outdir = args.out or os.path.join(root, "models", "opt-tiny-kjv")
    os.makedirs(outdir, exist_ok=True)

    import tokenizers
    import transformers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__}
    log(f"versions: {versions}")
    pkg = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "bible-kjv-text"],
                         capture_output=True, text=True).stdout.strip() or "unknown"

    # 1. corpus
    verses = dump_kjv()
    train_v, held_v, first_held = split_heldout(verses, args.heldout_frac)
    train_lines, held_lines = verses_to_lines(train_v), verses_to_lines(held_v)
    corpus_bytes = sum(map(len, train_lines)) + sum(map(len, held_lines))
    held_bytes = sum(map(len, held_lines))
    log(f"corpus: bible-kjv-text {pkg}, {len(verses)} verses, {corpus_bytes} bytes; held out "
        f"{first_held}..Rev: {len(held_v)} verses, {held_bytes} bytes")
    file_lines, n = [], 0
    for ln in held_lines:
        if n + len(ln) > args.heldout_file_bytes:
            break
        file_lines.append(ln)
        n += len(ln)
    with open(os.path.join(outdir, "heldout.txt"), "w") as f:
        f.write("".join(file_lines))

    # 2. tokenizer
    tok = train_tokenizer(train_lines, args.vocab, outdir)
    vocab_size = tok.get_vocab_size()
    tr_ids, tr_starts = encode_lines(tok, train_lines)
    he_ids, he_starts = encode_lines(tok, held_lines)
    hf_ids, hf_starts = encode_lines(tok, file_lines)
    log(f"tokenizer: vocab {vocab_size}; train {len(tr_ids)} tokens, held-out {len(he_ids)} tokens")

    # evaluation sets: packed whole verses; train sample = a spread of train chapters
    held_x, held_m = packed_windows(he_ids, he_starts, args.seq)
    hfile_x, hfile_m = packed_windows(hf_ids, hf_starts, args.seq)
    tr_all_x, tr_all_m = packed_windows(tr_ids, tr_starts, args.seq)
    sel = torch.from_numpy(np.linspace(0, len(tr_all_x) - 1, len(held_x)).round().astype(np.int64))
    tr_x, tr_m = tr_all_x[sel], tr_all_m[sel]
    small = max(8, min(48, len(held_x)))
    ss = torch.from_numpy(np.linspace(0, len(held_x) - 1, small).round().astype(np.int64))
    ts = torch.from_numpy(np.linspace(0, len(tr_x) - 1, small).round().astype(np.int64))
    ev = {"held_small": (held_x[ss], held_m[ss]), "train_small": (tr_x[ts], tr_m[ts])}

    # 3. model
    model = make_model(args, vocab_size)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, ffn {4 * args.hidden}, "
        f"vocab {vocab_size}: {nparams:,} parameters")
    model.train()
    res = train(model, args, tr_ids, tr_starts, ev)

    # 5. save (fp16) and 4. evaluate the saved weights
    model.config.torch_dtype = torch.float16
    model.half().save_pretrained(outdir, safe_serialization=True)
    for f in os.listdir(outdir):
        os.chmod(os.path.join(outdir, f), 0o644)
    model.float()
    final_train = evaluate(model, tr_x, tr_m)
    final_held = evaluate(model, held_x, held_m)
    final_hfile = evaluate(model, hfile_x, hfile_m)
    log(f"final (fp16 weights, fp32 compute): train {final_train:.4f} ppl {math.exp(final_train):.2f}; "
        f"held-out {final_held:.4f} ppl {math.exp(final_held):.2f}; "
        f"heldout.txt {final_hfile:.4f} ppl {math.exp(final_hfile):.2f}")
    smp = samples(outdir, args.seed)
    for s in smp:
        log(f"[{s['prompt']}] greedy: {s['greedy']!r}")
        log(f"[{s['prompt']}] sampled: {s['sampled']!r}")
    st_bytes = os.path.getsize(os.path.join(outdir, "model.safetensors"))
    info = dict(args=vars(args), versions=versions, pkg_version=pkg, corpus_bytes=corpus_bytes,
                heldout_bytes=held_bytes, heldout_first_book=first_held,
                heldout_tokens=int(held_m[:, 1:].sum()), heldout_file_bytes=n,
                heldout_file_tokens=int(hfile_m[:, 1:].sum()),
                train_eval_tokens=int(tr_m[:, 1:].sum()),
                train_tokens=len(tr_ids), vocab_size=vocab_size, params=nparams,
                st_bytes=st_bytes, final_train=final_train, final_held=final_held,
                final_held_file=final_hfile, samples=smp, folder_bytes=0,
                total_seconds=time.time() - t_start, **res)
    write_readme(outdir, info)
    info["folder_bytes"] = sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir))
    write_readme(outdir, info)
    info["folder_bytes"] = sum(os.path.getsize(os.path.join(outdir, f)) for f in os.listdir(outdir))
    write_readme(outdir, info)
    log(f"wrote {outdir}: {info['folder_bytes']:,} bytes; {info['total_seconds'] / 60:.1f} minutes in all")


if __name__ == "__main__":
    main()
