#!/usr/bin/env python3
"""make_hf_tokenizer_fixture.py - train the small tokenizer.json tokenizers
that tests/test_tokenizer.c checks runtime/text/ against, one of each kind
sluice reads, and record what the Hugging Face `tokenizers` library gives
for a set of hard strings.

Writes into tests/fixtures/tokenizer/hf/ (or OUTDIR), one folder each:
  llama3/   byte-level BPE with Llama 3's Split regex, ignore_merges,
            <|begin_of_text|> prepended by a TemplateProcessing
            post-processor, special tokens added after the vocabulary,
            merges in the older ["a b", ...] form
  qwen2/    byte-level BPE with Qwen2's Split regex (single digits) and its
            NFC normalizer, no BOS, merges in the newer [["a", "b"], ...]
            form
  llama2/   SentencePiece-style BPE as Llama 2 and Mistral v0.1 ship it:
            normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
            byte fallback tokens <0x00>..<0xFF> at ids 3..258 after
            <unk> <s> </s>, decoder Replace + ByteFallback + Fuse +
            Strip, tokenizer_config.json with add_bos_token
  metaspace/ the same vocabulary with the Metaspace pre-tokenizer
            (prepend_scheme "first", as newer Mistral files have) and the
            Metaspace decoder
and variants.jsonl: patches of those (model fields) and HF's ids and
decodes under them, for options the trained files leave untried, and
decodes of id runs no encode gives.
Each folder: tokenizer.json (and tokenizer_config.json for llama2) and
expected.jsonl, one JSON object per string:
  {"text_b64", "ids" (encode without special tokens), "ids_special"
   (add_special_tokens=True), "decoded_b64" (decode(ids_special)),
   "decoded_skip_b64" (decode(ids_special, skip_special_tokens=True)),
   "roundtrip" (whether decode(ids) gives the text back), and where there
   is a pre-tokenizer "piece_ends" (the byte offsets where its pieces of
   the whole text end, without the normalizer)}

Trained on Debian's license texts (/usr/share/common-licenses), vocab a few
thousand, so that CJK, emoji and most accents are not in the vocabulary and
go through single bytes (byte-level) or byte fallback (SentencePiece).

    /work/venv-tok/bin/python tools/make_hf_tokenizer_fixture.py [OUTDIR]

Deterministic for one tokenizers version (recorded in each expected.jsonl's
first line, {"tokenizers": version}).
"""
import base64
import glob
import json
import os
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MARK = "\u2581"


def corpus():
    out = []
    for p in sorted(glob.glob('/usr/share/common-licenses/*')):
        if os.path.isfile(p):
            with open(p, encoding='utf-8', errors='replace') as f:
                out.append(f.read())
    return out


def lines_of(texts):
    return [ln for t in texts for ln in t.split('\n')]


def byte_level(texts, regex, ignore_merges, specials, bos, nfc=False, vocab_size=2500):
    """vocab_size: the trained BPE's entries, the special tokens added after."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior='isolated', invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, tr)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    procs = [processors.ByteLevel(trim_offsets=False)]
    if bos:
        procs.append(processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))]))
    tok.post_processor = processors.Sequence(procs)
    return tok


def spm_model(texts, vocab_size=3000):
    """BPE on SentencePiece-marked words with Llama 2's id layout (vocab_size
    counts <unk> <s> </s> and the 256 byte tokens)."""
    tok = Tokenizer(models.BPE(unk_token='<unk>', byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(MARK),
                                           normalizers.Replace(' ', MARK)])
    # trained per word (never across a space), as SentencePiece does
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=MARK, prepend_scheme='never',
                                                 split=True)
    specials = ['<unk>', '<s>', '</s>'] + [f'<0x{b:02X}>' for b in range(256)]
    tr = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=specials,
                             limit_alphabet=80)
    tok.train_from_iterator(lines_of(texts), tr)
    return tok


def spm_llama2(base):
    d = json.loads(base.to_str())
    d['added_tokens'] = [a for a in d['added_tokens'] if a['content'] in ('<unk>', '<s>', '</s>')]
    for a in d['added_tokens']:
        a['normalized'] = False
    d['pre_tokenizer'] = None
    d['decoder'] = json.loads(decoders.Sequence([
        decoders.Replace(MARK, ' '), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(' ', 1, 0)]).__getstate__())
    bos = 1
    d['post_processor'] = json.loads(processors.TemplateProcessing(
        single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', bos)]).__getstate__())
    return Tokenizer.from_str(json.dumps(d))


def spm_metaspace(llama2):
    d = json.loads(llama2.to_str())
    d['normalizer'] = None
    d['pre_tokenizer'] = json.loads(pre_tokenizers.Metaspace(
        replacement=MARK, prepend_scheme='first', split=False).__getstate__())
    d['decoder'] = json.loads(decoders.Metaspace(replacement=MARK,
                                                 prepend_scheme='first').__getstate__())
    return Tokenizer.from_str(json.dumps(d))


def hard_cases(texts):
    cases = [
        '', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n', '  \n  x', 'a',
        'Hello world', ' Hello world', '  Hello  world  ', 'Hello   world', 'trailing ',
        'trailing   ', '\tTabbed\tline\t\twith tabs', 'line one\nline two\r\nline three\n',
        'para\n\n\nbreak', 'x \n\n y', '!!\n\n', 'end.\n',
        '0', '12', '123', '1234', '12345', '1234567890', '3.14159', '2024-01-01T12:00',
        '1,000,000', 'v2', 'abc123def', '٣٤٥ ١٢٣٤', 'x² ½ Ⅻ',
        "I'm", "don't", "DON'T", "It'S", "we'RE", "they'Ve", "you'LL", "I'D", "y'all'd've",
        "'hello'", "'s", "rock 'n' roll", "O'Neil's", "'ſup 'ſ",
        "I'mma", "'dunno", "'Sup", "'LLama", "'REally", "'veggie'd", "'tis", "'Twas", "'ma'am",
        'café naïve résumé', 'Zürich Ærøskøbing', 'e\u0301 a\u0300 combining',
        'Größe Straße', 'Ελληνικά κείμενα', 'Русский текст',
        # NFC: composed, reordered marks, singletons, exclusions, Hangul
        'a\u0323\u0302 a\u0302\u0323 e\u0301\u0301 \u212b \u2126 \u0958 \u1e9b\u0323',
        '\u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8 Vie\u0323\u0302t',
        'blocked a\u0363\u0301 e\u0363\u0302 o\u0328\u0304',
        '\u0301 leading mark, \u0f73 and \u0344 decompose, \ufb2c, \u00c5\u0301',
        '中文字符测试', '日本語のテキスト', '한국어 텍스트', 'العربية', 'עברית', 'हिन्दी',
        '😀', '👍🏽', '👨‍👩‍👧', '🇫🇷', 'emoji 😀 in text 🎉!', 'Hello世界123abc',
        'mixed 日本 and English', 'ＡＢＣ１２３', 'NBSP\u00a0here and\u3000ideographic',
        'ZWSP\u200bhere', 'soft\u00adhyphen',
        '<s>', '</s>', '<unk>', '<s>Hello</s> world', 'a<s>b', ' <s> ', '<s><s>',
        '<|begin_of_text|>Hi', 'x<|end_of_text|>y', '<|endoftext|>', '<|im_start|>user\nhi<|im_end|>',
        '<0x41>', MARK + 'already marked', 'a' + MARK + 'b',
        '\x00\x01\x1f', 'tab\x0bvt\x0cff',
        'def f(x):\n    return x  # comment\n',
        '    indented', 'a  b   c    d',
    ]
    # lines of the corpus, and long texts (the SentencePiece word is the
    # whole text: the long-word merge)
    for t in texts[:6]:
        cases.extend(t.split('\n')[5:9])
    cases.append(texts[0][:3000])
    cases.append(('Ünïcödé ' * 60) + '中文 ' * 40)
    return cases


def b64(s):
    return base64.b64encode(s.encode('utf-8')).decode('ascii')


def write(tok, out, cases, config=None, old_merges=False):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, 'tokenizer.json')
    tok.save(path, pretty=False)
    if old_merges:  # the older "a b" form of merges, which files still use
        with open(path, encoding='utf-8') as f:
            d = json.load(f)
        d['model']['merges'] = [' '.join(m) for m in d['model']['merges']]
        with open(path, 'w', encoding='utf-8') as f:
            json.dump(d, f, ensure_ascii=False, separators=(',', ':'))
    if config:
        with open(os.path.join(out, 'tokenizer_config.json'), 'w') as f:
            json.dump(config, f, indent=1)
            f.write('\n')
    # what sluice reads back must be the same tokenizer
    tok = Tokenizer.from_file(os.path.join(out, 'tokenizer.json'))
    with open(os.path.join(out, 'expected.jsonl'), 'w', encoding='ascii') as f:
        f.write(json.dumps({'tokenizers': tokenizers.__version__}) + '\n')
        for text in cases:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_sp = tok.encode(text, add_special_tokens=True).ids
            rec = {
                'text_b64': b64(text), 'ids': ids, 'ids_special': ids_sp,
                'decoded_b64': b64(tok.decode(ids_sp, skip_special_tokens=False)),
                'decoded_skip_b64': b64(tok.decode(ids_sp, skip_special_tokens=True)),
                'roundtrip': tok.decode(ids, skip_special_tokens=False) == text,
            }
            if tok.pre_tokenizer:
                # the pre-tokenizer's pieces over the whole text (no
                # normalizer, no added tokens split out), as byte offsets
                # where each ends
                pieces = tok.pre_tokenizer.pre_tokenize_str(text)
                rec['piece_ends'] = [len(text[:e].encode('utf-8')) for _, (_, e) in pieces]
            f.write(json.dumps(rec) + '\n')


# Variants of the tokenizers above, each a patch of model fields (and of
# top-level fields), for the options the trained files do not exercise:
# ignore_merges on a vocabulary its merges cannot reach, unk with and
# without fuse_unk in place of byte fallback, the GPT-2 regex of
# ByteLevel(use_regex=True), added tokens marked "normalized" (older Llama 2
# files), which HF matches in the normalized text.  And decodes of id runs no encode gives (partial UTF-8 in byte
# fallback tokens).
NORM_TEXTS = ['<s>Hello', 'Hello<s> world', 'a <s>b</s>', ' <s> ', '<unk><s>', '<s>',
              '<|begin_of_text|>Hi there<|eot_id|>', '<|im_start|>user\nhi<|im_end|>']
GPT2_PRE = {'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': False,
                              'trim_offsets': True, 'use_regex': True}, 'normalizer': None}
VARIANTS = [
    ('llama3', {'merges': []}, ['the', ' the', ' thesis', 'Hello world', ' the the']),
    ('qwen2', {}, ["GPT-2's regex: 12345  x\n\n y  ", "I'M 'Sup?! caf\u00e9"], GPT2_PRE),
    ('llama2', {}, NORM_TEXTS, 'normalized'),
    ('metaspace', {}, NORM_TEXTS, 'normalized'),
    ('llama3', {}, NORM_TEXTS, 'normalized'),
    ('qwen2', {}, NORM_TEXTS + ['<|im_start|>e\u0301<|im_end|>x'], 'normalized'),
    ('llama2', {'byte_fallback': False}, ['caf\u00e9 \u65e5\u672c\u8a9e', '\U0001F600\U0001F600 x']),
    ('llama2', {'byte_fallback': False, 'fuse_unk': False}, ['\u65e5\u672c\u8a9e \U0001F600\U0001F600']),
]
DECODES = [
    ('llama2', [3 + 0xE4, 3 + 0xB8]), ('llama2', [3 + 0xE4, 3 + 0xB8, 3 + 0xAD]),
    ('llama2', [3 + 0x41, 3 + 0xFF, 3 + 0x42]), ('llama2', [3 + 0xE4, 1, 3 + 0xB8]),
    ('metaspace', [3 + 0xE4, 3 + 0xB8, 3 + 0xAD]), ('qwen2', [2500, 2501]),
]


def write_variants(out):
    with open(os.path.join(out, 'variants.jsonl'), 'w', encoding='ascii') as f:
        f.write(json.dumps({'tokenizers': tokenizers.__version__}) + '\n')
        for kind, patch, texts, *root in VARIANTS:
            with open(os.path.join(out, kind, 'tokenizer.json'), encoding='utf-8') as g:
                d = json.load(g)
            if root and root[0] == 'normalized':  # every added token normalized
                root = [{'added_tokens': [dict(a, normalized=True) for a in d['added_tokens']]}]
            d['model'].update(patch)
            d.update(root[0] if root else {})
            tok = Tokenizer.from_str(json.dumps(d))
            for text in texts:
                ids = tok.encode(text, add_special_tokens=False).ids
                dec = tok.decode(ids, skip_special_tokens=False)
                rec = {'kind': kind, 'patch': patch, 'text_b64': b64(text), 'ids': ids,
                       'decoded_b64': b64(dec)}
                if root:
                    rec['root_patch'] = root[0]
                f.write(json.dumps(rec) + '\n')
        for kind, ids in DECODES:
            tok = Tokenizer.from_file(os.path.join(out, kind, 'tokenizer.json'))
            dec = tok.decode(ids, skip_special_tokens=False)
            f.write(json.dumps({'kind': kind, 'ids': ids, 'decoded_b64': b64(dec)}) + '\n')


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else 'tests/fixtures/tokenizer/hf'
    texts = corpus()
    cases = hard_cases(texts)
    write(byte_level(texts, LLAMA3_RE, True,
                     ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>'],
                     '<|begin_of_text|>'), os.path.join(out, 'llama3'), cases, old_merges=True)
    write(byte_level(texts, QWEN2_RE, False,
                     ['<|endoftext|>', '<|im_start|>', '<|im_end|>'], None, nfc=True),
          os.path.join(out, 'qwen2'), cases)
    l2 = spm_llama2(spm_model(texts))
    write(l2, os.path.join(out, 'llama2'), cases,
          {'add_bos_token': True, 'add_eos_token': False, 'bos_token': '<s>',
           'eos_token': '</s>', 'unk_token': '<unk>', 'tokenizer_class': 'LlamaTokenizer'})
    write(spm_metaspace(l2), os.path.join(out, 'metaspace'), cases)
    write_variants(out)


if __name__ == '__main__':
    main()
