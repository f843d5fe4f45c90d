#!/usr/bin/env python3
"""make_tokenizer_fixture.py - build the small GPT-2-style tokenizer that
tests/test_tokenizer.c checks runtime/text/ against, and the expected
Hugging Face outputs.

Writes into tests/fixtures/tokenizer/ (or OUTDIR):
  corpus.txt      a varied corpus (English with contractions, numbers,
                  punctuation and whitespace runs, CJK, emoji with ZWJ and
                  skin tones, accented and combining Latin, Arabic, Hebrew,
                  ..., and a few lines with raw invalid UTF-8 bytes)
  vocab.json,     a Hugging Face `tokenizers` ByteLevelBPETokenizer
  merges.txt      (add_prefix_space=False, like GPT-2) trained on the valid
                  lines, vocab 2000, with <s> <pad> </s> <unk> as ids 0..3
  expected.jsonl  one JSON object per test string:
                  {"kind", "valid_utf8", "text_b64", "ids", "piece_lens",
                   "decoded_b64", "decoded_skip_b64"}
                  piece_lens: byte length of each pre-tokenizer piece
                  ids_replaced (invalid UTF-8 only): HF encode of
                  raw.decode("utf-8", errors="replace")
                  ids: HF encode without special tokens (no BOS), with OPT's
                  special tokens "</s>" and "<pad>" split out of the text;
                  decoded: HF decode(ids) / decode(ids, skip_special_tokens)
  classes.txt     HF's class (letter/number/space/other) of every code
                  point, as runs, probed through HF's pre-tokenizer

The reference tokenizer is assembled the way transformers builds OPT's
fast tokenizer (BPE from the files, ByteLevel pre-tokenizer without prefix
space, ByteLevel decoder, added special tokens "</s>" and "<pad>") and is
cross-checked against transformers' GPT2Tokenizer loaded from the files.

Invalid UTF-8 cannot be given to HF (its input is a string).  For those
strings the expected ids come from HF's own pieces: the pre-tokenizer runs
on the text with each invalid byte replaced by U+FFFD (same class: neither
letter, number nor space), and HF's BPE model then tokenizes each word's
raw bytes, invalid ones included.  This emulation is checked to equal
HF's encode on every valid string.  decoded_b64 is always HF's real decode.

    python3 tools/make_tokenizer_fixture.py [OUTDIR]

Deterministic: same tokenizers version, same files.
"""
import base64
import json
import os
import random
import sys

from tokenizers import (AddedToken, ByteLevelBPETokenizer, Tokenizer, decoders,
                        models, pre_tokenizers)

SPECIALS = ['<s>', '<pad>', '</s>', '<unk>']
OPT_SPECIAL = ['</s>', '<pad>']  # OPT: bos = eos = unk = "</s>", pad = "<pad>"

PROSE = """\
It's a truth universally acknowledged that a tokenizer in possession of a good vocabulary must be in want of merges.
I'm sure you'll agree: they've done it, we'd have known, and you're right that it isn't over.
DON'T PANIC. IT'S FINE. WE'RE HERE, YOU'VE SEEN IT, I'M SURE, THEY'LL COME, SHE'D KNOW.
The cat's toy, the dogs' bowls, and James's hat were all in Charles' car.
"Don't," she said, "don't you dare." 'Twas brillig, and the slithy toves did gyre.
He said 'hello' and 'goodbye' and 'so long' in the same breath... then left!!!
Rock 'n' roll isn't dead; it's just resting. Ma'am, y'all'd've liked it.
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.
Pack my box with five dozen liquor jugs! How vexingly quick daft zebras jump?
In 1969, 600,000,000 people watched; by 2024 the number was 3.14159 times larger (approx.).
Call 555-0123 or +1 (800) 555-0199 ext. 42; fax: 555.0100. Room #12B, floor -3.
Version 2.10.3-rc1 was released on 2023-11-05T14:30:00Z with 1,234 fixes and 0x1F changes.
Prices: $19.99, EUR 5,00, 100% off, 50/50 odds, 3/4 cup, 1e-10 error, -0.0 and +inf.
Wait... what?!?! No way!!! Really??? Yes---absolutely---yes.
Ellipses… em—dashes – en dashes “curly quotes” ‘single’ «guillemets» and „low quotes“.
    Indented with four spaces, and then    four more in the middle.
\tTabbed line\twith\ttabs\t\tand double tabs.
Trailing spaces here   
Trailing tab here\t
Mixed  \t  whitespace \t\t runs   everywhere .
A line with a single trailing space 
She sells sea-shells by the sea-shore; the shells she sells are sea-shells, I'm sure.
"Quoted," he said. 'Single-quoted,' she replied. `Backticked`, they typed.
We've got to go; you've got to stay; they've got nothing to say.
You'd think he'd know; I'd rather not; we'd better leave.
I'll be there; you'll see; they'll wonder; it'll rain.
Who's there? What's that? Where's the book? There's no book.
O'Brien and O'Neil met D'Angelo at McDonald's on St. Patrick's Day.
ISN'T IT? AREN'T THEY? WON'T YOU? CAN'T WE? SHOULDN'T I?
The year 2000 problem (Y2K) cost an estimated $300 billion; 1999 -> 2000.
Numbers: 0 1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890.
More digits: 007 0042 3.0 10.01 99.999 1,000,000 1_000_000 1e6 2^32 = 4294967296.
e-mail me at someone@example.com or visit https://example.org/path?q=1&r=two#frag.
Path: /usr/local/lib/python3.11/site-packages/tokenizers/__init__.py:42
C:\\Users\\Admin\\Documents\\file (1).txt
Hashtags #NLP #AI and mentions @user_name, plus ~tilde~ and ^caret^ and |pipes|.
Brackets: (round) [square] {curly} <angle> and nested ((([[[{{{}}}]]]))).
Math: a+b=c, x*y/z, 2 < 3 > 1, a != b, a == b, a <= b, x >= y, !x && y || z.
Markdown: **bold**, *italic*, __under__, ~~strike~~, `code`, [link](url).
-- dashes --- and ___ underscores ___ and *** stars *** and ### hashes ###
end.
"""

CODE = """\
int main(int argc, char **argv) {
\tfor (int i = 0; i < argc; i++)
\t\tprintf("%s\\n", argv[i]);
\treturn 0;
}
def f(x):
    return {"key": [1, 2, 3], 'other': None}  # comment
{"name": "sluice", "version": "0.1.0", "ids": [2, 31414, 232], "ok": true}
SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son';
if x != nil { return fmt.Errorf("bad: %w", err) }
<html><body><p class="x">Hello &amp; welcome</p></body></html>
#include <stdio.h>
    x = y  +  z   # three spaces
"""

MULTI = """\
Café, naïve, résumé, coöperate, Zürich, São Paulo, Kraków, Ærøskøbing, Þingvellir.
Ça va? Où est la bibliothèque? J'ai dû partir à l'aube, n'est-ce pas?
Größe, Straße, Ärger, Öl, Übermut — ÄÖÜ äöü ß ẞ.
Tiếng Việt có nhiều dấu: Hà Nội, Huế, Đà Nẵng, Thành phố Hồ Chí Minh.
Decomposed: e\u0301 a\u0300 o\u0308 n\u0303 c\u0327 and stacked a\u0301\u0302\u0303\u0304 marks.
A lone combining mark \u0301 and Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o text.
Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.
Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ΑΒΓΔ αβγδ.
中文：我能吞下玻璃而不伤身体。今天天气很好，我们去公园吧！
日本語：私はガラスを食べられます。それは私を傷つけません。カタカナとひらがな。
한국어: 나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.
العربية: أنا قادر على أكل الزجاج و هذا لا يؤلمني. ١٢٣ ٤٥٦ ٧٨٩٠
עברית: אני יכול לאכול זכוכית וזה לא מזיק לי. שָׁלוֹם
हिन्दी: मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.
ไทย: ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ
Emoji: 😀 😃 😄 😁 😆 🙂 🙃 😉 😊 😇 🥰 😍 🤩 😘 👍 👎 ❤️ 🔥 ✨ 🎉
Skin tones: 👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 👋🏽 🧑🏿‍💻
ZWJ: 👨‍👩‍👧‍👦 👩‍❤️‍👨 🏳️‍🌈 🏴‍☠️ 👨🏽‍🚀 🧑‍🤝‍🧑 ❤️‍🔥
Flags: 🇺🇸 🇬🇧 🇯🇵 🇩🇪 🇫🇷 and keycaps 1️⃣ 2️⃣ #️⃣ *️⃣
Mixed: I ❤️ NY, café☕, 100💯, ok👌!, don't😅 stop🛑.
Roman Ⅻ, fractions ½ ¾ ⅓, superscripts x² y³, subscripts H₂O, circled ① ② ③.
Fullwidth: ＡＢＣ１２３！ and ideographic space:　between　words.
Symbols: © ® ™ § ¶ † ‡ • ° ± × ÷ ∞ ≈ ≠ ≤ ≥ → ← ↑ ↓ ∑ ∏ √ ∫ ∂ ∇.
Currency: € £ ¥ ₹ ₽ ₩ ₿ ¢ and NBSP:\u00a0here, thin\u2009space, ZWSP\u200bhere, BOM\ufeffhere.
Control-ish: soft\u00adhyphen, word\u2060joiner, line\u2028separator, para\u2029separator.
"""

WORDS = ("the of and to in is was for that with as on by at from it he she they we "
         "you I time year people way day man thing woman life child world school "
         "state family student group country problem hand part place case week "
         "company system program question work government number night point home "
         "water room mother area money story fact month lot right study book eye job "
         "word business issue side kind head house service friend father power hour "
         "game line end member law car city community name president team minute "
         "idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy "
         "moment air teacher force education token merge vocabulary byte encode decode "
         "model batch generate sequence layer attention weight cache memory").split()
CONTR = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'LL"]
PUNCT = [".", ",", "!", "?", ";", ":", "...", "!!", "?!", "--", "—", "(", ")",
         "\"", "'", "-", "/", "&", "*", "#", "@", "%", "$"]
SPACES = [" ", " ", " ", " ", "  ", "   ", "\t", " \t", "\t ", "    "]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "🎉", "✨", "🧑🏿‍💻", "😂"]
FOREIGN = ["café", "naïve", "日本", "中文字", "한국", "мир", "κόσμος", "שלום",
           "مرحبا", "नमस्ते", "ŻÓŁĆ", "Ω", "ﬁ", "e\u0301"]


def gen_lines(rng, n):
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 16)):
            r = rng.random()
            if r < 0.55:
                w = rng.choice(WORDS)
                if rng.random() < 0.15:
                    w = w.capitalize()
                if rng.random() < 0.05:
                    w = w.upper()
                if rng.random() < 0.12:
                    w += rng.choice(CONTR)
                parts.append(w)
            elif r < 0.68:
                parts.append(str(rng.choice([rng.randint(0, 9), rng.randint(0, 999),
                                             rng.randint(0, 10**9),
                                             round(rng.uniform(0, 100), 3)])))
            elif r < 0.82:
                parts.append(''.join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4))))
            elif r < 0.9:
                parts.append(rng.choice(FOREIGN))
            else:
                parts.append(rng.choice(EMOJI))
            parts.append(rng.choice(SPACES) if rng.random() < 0.9 else '')
        line = ''.join(parts)
        if rng.random() < 0.2:
            line = line.rstrip()
        out.append(line)
    return out


# Lines with bytes that are not well-formed UTF-8.
INVALID_LINES = [
    b'Invalid byte \xff in the middle and \xfe too.',
    b'Lone continuation \x80\x81\x82 bytes and a truncated \xe2\x82 euro.',
    b'Overlong slash \xc0\xaf and overlong NUL \xc0\x80 and \xe0\x80\xaf.',
    b'Surrogate \xed\xa0\x80 and beyond-range \xf4\x90\x80\x80 and \xf8\x88\x80\x80\x80.',
    b'Truncated emoji \xf0\x9f\x98 then text, and \xf0\x9f at end \xf0',
    b'caf\xe9 latin-1 text: na\xefve r\xe9sum\xe9 (\xa0nbsp\xa0) \xb5 \xbd',
    b'\xff\xfe\xfd',
    b' \x80abc \xc3( \xc3\xc3\xa9 dont\x92t it\x92s',
]

EXTRAS = [
    "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", " \n", "\n ", "\r\n", " \r\n ",
    "a  b", "a   b", "a \tb", "a\t b", "a\n\nb", "a \n b", "a\u00a0b", "a \u00a0b",
    "\u00a0a", " \u00a0a", "\u3000x", "x\u3000", "a  ", "a\n", "  a", "\t\ta",
    "don't", "DON'T", "I'm", "I'M", "we'll", "WE'LL", "they're", "you've", "he'd",
    "'s", "'S", "x's", "x'S", "''s", " 's", "!'s", "'", "''", "'''", "' s",
    "'ll've'd", "'re're", "a'b'c", "rock'n'roll", "'t's", "\"'s\"", "it’s",
    "123456", "1234567890123", "3.14", "1,000", "-42", "1e10", "٣٤٥", "Ⅻ", "½x", "x²",
    "hello world!!!", "hello, world", "Hello World", "HELLO WORLD", "hi!?!?",
    "... --- ...", "!!!", "   !!!   ", "a.b.c", "(a)", "<html>",
    "</s>", "<pad>", "<s>", "<unk>", "a</s>b", "</s></s>", " </s> ", "</s>\n",
    "<pad></s><pad>", "</s", "<</s>>", "<pad>hello", "hello</s>", "x  </s>  y",
    "</s> don't", "<s>text</s>", "<pa</s>d>", "</s><unk><s><pad>",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇬🇧", "1️⃣", " 😀 😀", "a😀b", "😀😀😀",
    "e\u0301", "\u0301", " \u0301", "a\u0301\u0301b", "\u200b", "a\u200bb", "\ufeff",
    "\x00", "a\x00b", "\x1c\x1d\x1e\x1f", "\x7f", "\x0b\x0c",
    "\U000105c0\U000105c1",   # Todhri (Unicode 16): letters for HF
    "x\U0001e4d0y\U0001e4f0",  # Nag Mundari (Unicode 15): letter, digit
    "\U0001f9e0\U0001faea",   # Unicode 16 emoji (other)
    "\U0010ffff", "\ue000", "\uffff",
    "日本語のテキスト", "中文，标点。", "한국어 텍스트",
    "The " * 50,
    "x" * 300,
    "ab" * 200,
    " " * 40 + "y",
    "!" * 100,
    "9" * 100,
]

INVALID_EXTRAS = [
    b'\xff', b'\x80', b'\x80abc', b'a\xc3', b'\xc3(', b'\xe2\x82', b'\xe2\x82 x',
    b'\xed\xa0\x80', b'\xf4\x90\x80\x80', b'\xc0\xaf', b' \xff\xfe hi',
    b'abc\xff def', b'\xf0\x9f\x98 ok', b'\xf0\x9f\x98\x80\xf0\x9f\x98',
    b'</s>\xff</s>', b'  \xff', b"\xff's", b'1\xff2', b'\xc3\xa9\xff\xc3\xa9',
]


def build_corpus():
    rng = random.Random(20240517)
    lines = []
    lines += PROSE.splitlines()
    lines += CODE.splitlines()
    lines += MULTI.splitlines()
    lines += gen_lines(rng, 560)
    # The prose again with different spacing, so merges are frequent enough.
    for line in PROSE.splitlines()[:20]:
        lines.append(line.replace(' ', rng.choice(['  ', ' ', '\t', ' '])))
    out = [l.encode('utf-8') for l in lines]
    # Sprinkle the invalid lines through the corpus.
    for k, b in enumerate(INVALID_LINES):
        out.insert(7 + 23 * k, b)
    return out


def b64(b):
    return base64.b64encode(b).decode('ascii')


def byte_level(b):
    bs = (list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAD)) +
          list(range(0xAE, 0x100)))
    cs = bs[:]
    n = 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return ''.join(chr(table[x]) for x in b)


def split_specials(s):
    """Leftmost-longest split on OPT's special tokens: [(text, is_special)]."""
    out, pos = [], 0
    while pos < len(s):
        best, blen = len(s), 0
        for sp in OPT_SPECIAL:
            i = s.find(sp, pos)
            if i >= 0 and (i < best or (i == best and len(sp) > blen)):
                best, blen = i, len(sp)
        if best > pos:
            out.append((s[pos:best], False))
        if blen:
            out.append((s[best:best + blen], True))
        pos = best + blen
    return out


def emulate(ref, raw):
    """HF ids for any bytes: HF pre-tokenizer on the text with invalid bytes
    as U+FFFD, HF BPE model on each word's raw bytes.  Also returns the
    byte length of each piece (special tokens are pieces too)."""
    s = raw.decode('utf-8', 'surrogateescape')
    ids, lens = [], []
    for seg, special in split_specials(s):
        if special:
            ids.append(ref.token_to_id(seg))
            lens.append(len(seg))
            continue
        shown = ''.join('\ufffd' if 0xDC80 <= ord(c) <= 0xDCFF else c for c in seg)
        at = 0
        for _, (a, b) in ref.pre_tokenizer.pre_tokenize_str(shown):
            assert a == at, 'pieces must tile the text'
            at = b
            word = seg[a:b].encode('utf-8', 'surrogateescape')
            lens.append(len(word))
            ids += [t.id for t in ref.model.tokenize(byte_level(word))]
        assert at == len(seg)
    assert sum(lens) == len(raw)
    return ids, lens


def hf_classes():
    """Runs of HF's class (L N S O) over all code points, probed through the
    ByteLevel pre-tokenizer itself: [(lo, hi, cls)]."""
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)

    def one(s):
        return len(pt.pre_tokenize_str(s)) == 1

    runs = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            k = 'O'  # no UTF-8 form; HF never sees them
        else:
            c = chr(cp)
            k = ('L' if one('a' + c) else 'N' if one('1' + c) else
                 'O' if one('!' + c) else 'S' if one('\t' + c) else '?')
            assert k != '?', hex(cp)
        if runs and runs[-1][2] == k:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, k])
    return runs


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'fixtures',
        'tokenizer'))
    os.makedirs(outdir, exist_ok=True)
    corpus = build_corpus()
    with open(os.path.join(outdir, 'corpus.txt'), 'wb') as f:
        f.write(b'\n'.join(corpus) + b'\n')

    valid = [l.decode('utf-8') for l in corpus if is_utf8(l)]
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(valid, vocab_size=2000, min_frequency=2,
                            special_tokens=SPECIALS, show_progress=False)
    bpe.save_model(outdir)
    vocab_path = os.path.join(outdir, 'vocab.json')
    merges_path = os.path.join(outdir, 'merges.txt')
    vocab = json.load(open(vocab_path, encoding='utf-8'))
    assert [vocab[s] for s in SPECIALS] == [0, 1, 2, 3], 'special ids'

    ref = Tokenizer(models.BPE.from_file(vocab_path, merges_path))
    ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                 use_regex=True)
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in OPT_SPECIAL])

    from transformers import GPT2Tokenizer
    hf = GPT2Tokenizer(vocab=vocab_path, merges=merges_path, bos_token='</s>',
                       eos_token='</s>', unk_token='</s>', pad_token='<pad>',
                       add_prefix_space=False)

    whole = b'\n'.join(corpus) + b'\n'
    cases = [('corpus', l) for l in corpus]
    cases += [('extra', s.encode('utf-8')) for s in EXTRAS]
    cases += [('invalid', b) for b in INVALID_EXTRAS]
    cases += [('whole', whole)]

    n_valid = n_invalid = 0
    with open(os.path.join(outdir, 'expected.jsonl'), 'w') as f:
        for kind, raw in cases:
            ok = is_utf8(raw)
            if ok:
                text = raw.decode('utf-8')
                ids = ref.encode(text, add_special_tokens=False).ids
                e_ids, lens = emulate(ref, raw)
                assert e_ids == ids, ('emulation differs', text)
                t_ids = hf.encode(text, add_special_tokens=False)
                assert t_ids == ids, ('transformers differs', text, t_ids, ids)
                n_valid += 1
            else:
                ids, lens = emulate(ref, raw)
                n_invalid += 1
            dec = ref.decode(ids, skip_special_tokens=False).encode('utf-8')
            dec_skip = ref.decode(ids, skip_special_tokens=True).encode('utf-8')
            if ok:
                assert dec == raw, ('round trip', raw)
            rec = {'kind': kind, 'valid_utf8': ok, 'text_b64': b64(raw),
                   'ids': ids, 'piece_lens': lens, 'decoded_b64': b64(dec),
                   'decoded_skip_b64': b64(dec_skip)}
            if not ok:
                rec['ids_replaced'] = ref.encode(
                    raw.decode('utf-8', 'replace'), add_special_tokens=False).ids
            f.write(json.dumps(rec, separators=(',', ':')) + '\n')
    runs = hf_classes()
    with open(os.path.join(outdir, 'classes.txt'), 'w') as f:
        f.write('# HF ByteLevel pre-tokenizer class of every code point, as runs:\n'
                '# LO HI CLASS (hex; L letter, N number, S space, O other)\n')
        for lo, hi, k in runs:
            f.write('%X %X %s\n' % (lo, hi, k))
    print('%s: vocab %d, %d merges, %d strings (%d with invalid UTF-8), '
          'corpus %d bytes' % (outdir, len(vocab),
                               sum(1 for l in open(merges_path, encoding='utf-8')) - 1,
                               n_valid + n_invalid, n_invalid, len(whole)))


def is_utf8(b):
    try:
        b.decode('utf-8')
        return True
    except UnicodeDecodeError:
        return False


if __name__ == '__main__':
    main()
