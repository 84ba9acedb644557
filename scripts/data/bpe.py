#!/usr/bin/python3
"""Byte-level BPE for the mcv proving model: train, encode, decode.

Token strings use GPT-2's byte-to-unicode alphabet (token i < 256 is byte i),
merges are ranked by the order they were learned, and text is pre-tokenized
the way llama.cpp's `qwen35` pre-tokenizer splits it (Qwen2's pattern, with
combining marks \\p{M} counted as letters):

    (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
    |[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+ | \\p{N} | ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*
    |\\s*[\\r\\n]+ | \\s+(?!\\S) | \\s+

Python's `re` has no \\p{..} classes and python3-regex may be absent, so the
splitter below walks the string by hand with unicodedata categories.
`pre="qwen2"` gives the older Qwen2 pattern (marks are punctuation there).

Special tokens are cut out of the text before pre-tokenization (longest
first) and are never merged with neighbours.

    python3 scripts/data/bpe.py train [--n N] [--vocab V] [--out tokenizer.json]
    python3 scripts/data/bpe.py encode "text"      # prints ids
    python3 scripts/data/bpe.py selftest          # round trips on random input
"""
import functools
import json
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PATH = os.path.join(HERE, "tokenizer.json")

# llama.cpp token types (tokenizer.ggml.token_type)
T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER_DEFINED = 1, 2, 3, 4

# In vocabulary order, appended after the merges.  <think>/</think> are user
# defined (shown when the model thinks aloud); the others are control tokens.
SPECIALS = [("<|endoftext|>", T_CONTROL), ("<|im_start|>", T_CONTROL),
            ("<|im_end|>", T_CONTROL), ("<think>", T_USER_DEFINED),
            ("</think>", T_USER_DEFINED), ("<image>", T_CONTROL),
            ("</image>", T_CONTROL), ("<slice>", T_CONTROL), ("</slice>", T_CONTROL),
            ("<image_id>", T_CONTROL), ("</image_id>", T_CONTROL), ("<unk>", T_UNKNOWN)]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}

# Unicode White_Space, the set llama.cpp's unicode tables flag as whitespace
# (Python's str.isspace also accepts U+001C..U+001F, which \s does not).
WHITESPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                        *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


@functools.lru_cache(maxsize=65536)
def _cls(ch):
    """'L' letter, 'N' number, 'M' mark, 'W' whitespace, 'P' anything else."""
    if ord(ch) in WHITESPACE:
        return "W"
    c = unicodedata.category(ch)[0]
    return c if c in "LNM" else "P"


_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def pretokenize(text, pre="qwen35"):
    """Splits text into pre-tokens with the regex's leftmost-alternative semantics."""
    marks = pre == "qwen35"
    n = len(text)
    cls = [_cls(c) for c in text]
    if marks:
        isletter = [c in "LM" for c in cls]
        ispunct = [c == "P" for c in cls]
    else:
        isletter = [c == "L" for c in cls]
        ispunct = [c in "PM" for c in cls]
    out = []
    i = 0
    while i < n:
        c = text[i]
        # 1. English contractions
        if c == "'" and i + 1 < n:
            low = text[i + 1:i + 3].lower()
            m = next((k for k in _CONTRACTIONS if low.startswith(k[1:])), None)
            if m:
                j = i + len(m)
                out.append(text[i:j])
                i = j
                continue
        # 2. optional non-letter/number/newline prefix, then letters
        j = i
        if not isletter[i] and cls[i] != "N" and c not in "\r\n" and i + 1 < n and isletter[i + 1]:
            j = i + 1
        if isletter[j]:
            while j < n and isletter[j]:
                j += 1
            out.append(text[i:j])
            i = j
            continue
        # 3. one digit
        if cls[i] == "N":
            out.append(c)
            i += 1
            continue
        # 4. optional space, punctuation run, trailing newlines
        j = i + 1 if c == " " and i + 1 < n and ispunct[i + 1] else i
        if ispunct[j]:
            while j < n and ispunct[j]:
                j += 1
            while j < n and text[j] in "\r\n":
                j += 1
            out.append(text[i:j])
            i = j
            continue
        # 5-7. whitespace: up to the last newline of the run; else the run
        # minus its last character when a non-space follows; else the run.
        assert cls[i] == "W"
        j = i
        last_nl = -1
        while j < n and cls[j] == "W":
            if text[j] in "\r\n":
                last_nl = j
            j += 1
        if last_nl >= 0:
            j = last_nl + 1
        elif j < n and j - i > 1:
            j -= 1
        out.append(text[i:j])
        i = j
    return out


def to_symbols(s):
    return "".join(B2U[b] for b in s.encode("utf-8"))


class Tokenizer:
    def __init__(self, tokens, token_type, merges, pre="qwen35"):
        self.tokens = tokens
        self.token_type = token_type
        self.merges = merges
        self.pre = pre
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        self.special = {t: i for i, (t, ty) in enumerate(zip(tokens, token_type))
                        if ty in (T_CONTROL, T_USER_DEFINED, T_UNKNOWN)}
        self._special_sorted = sorted(self.special, key=len, reverse=True)
        self._bpe = functools.lru_cache(maxsize=200000)(self._bpe_uncached)

    @classmethod
    def load(cls, path=DEFAULT_PATH):
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        return cls(d["tokens"], d["token_type"], d["merges"], d.get("pre", "qwen35"))

    def _bpe_uncached(self, word):
        syms = list(word)
        ranks = self.ranks
        while len(syms) > 1:
            best, bi = None, -1
            for k in range(len(syms) - 1):
                r = ranks.get((syms[k], syms[k + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, k
            if best is None:
                break
            a, b = syms[bi], syms[bi + 1]
            merged, k = [], 0
            # merge every occurrence of this pair, left to right
            while k < len(syms):
                if k < len(syms) - 1 and syms[k] == a and syms[k + 1] == b:
                    merged.append(a + b)
                    k += 2
                else:
                    merged.append(syms[k])
                    k += 1
            syms = merged
        return tuple(self.ids[s] for s in syms)

    def split_special(self, text, parse_special=True):
        """Yields (is_special, piece).  As in llama.cpp, user-defined tokens
        (<think>) are always cut out; control and unknown tokens only with
        parse_special.  Longest match first."""
        cands = [s for s in self._special_sorted
                 if parse_special or self.token_type[self.special[s]] == T_USER_DEFINED]
        i, start, n = 0, 0, len(text)
        while i < n:
            if text[i] == "<":
                m = next((s for s in cands if text.startswith(s, i)), None)
                if m:
                    if start < i:
                        yield False, text[start:i]
                    yield True, m
                    i += len(m)
                    start = i
                    continue
            i += 1
        if start < n:
            yield False, text[start:]

    def encode(self, text, special=True):
        """Token ids.  special=False reads control markers such as <image> as
        plain text (llama.cpp's parse_special=false)."""
        ids = []
        for is_sp, piece in self.split_special(text, special):
            if is_sp:
                ids.append(self.special[piece])
            else:
                for w in pretokenize(piece, self.pre):
                    ids.extend(self._bpe(to_symbols(w)))
        return ids

    def decode_bytes(self, ids, special=True):
        """Bytes of the ids; control/unknown tokens only with special,
        user-defined ones always (as llama.cpp renders pieces)."""
        out = bytearray()
        for i in ids:
            t, ty = self.tokens[i], self.token_type[i]
            if ty == T_NORMAL:
                out.extend(U2B[c] for c in t)
            elif special or ty == T_USER_DEFINED:
                out.extend(t.encode("utf-8"))
        return bytes(out)

    def decode(self, ids, special=True):
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def id(self, token):
        return self.ids[token]


# --------------------------------------------------------------------------
# Training

def train(texts, vocab_size, pre="qwen35", min_freq=2, log=None):
    """Learns merges until the vocabulary (bytes + merges + specials) reaches
    vocab_size or no pair occurs min_freq times.  Ties break on the pair's
    string so the result does not depend on dict order."""
    probe = Tokenizer([t for t, _ in SPECIALS], [ty for _, ty in SPECIALS], [], pre)
    freq = {}
    for text in texts:
        for is_sp, piece in probe.split_special(text):
            if is_sp:
                continue
            for w in pretokenize(piece, pre):
                s = to_symbols(w)
                freq[s] = freq.get(s, 0) + 1
    words = [list(w) for w in freq]
    counts = [freq[w] for w in freq]
    pairs, where = {}, {}
    for wi, syms in enumerate(words):
        for k in range(len(syms) - 1):
            p = (syms[k], syms[k + 1])
            pairs[p] = pairs.get(p, 0) + counts[wi]
            where.setdefault(p, set()).add(wi)
    tokens = [B2U[b] for b in range(256)]
    merges = []
    n_merges = vocab_size - 256 - len(SPECIALS)
    while len(merges) < n_merges and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], tuple(-ord(c) for c in kv[0][0] + "\0" + kv[0][1])))
        (a, b), c = best
        if c < min_freq:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        for wi in sorted(where.pop((a, b), ())):
            syms, cnt = words[wi], counts[wi]
            for k in range(len(syms) - 1):  # forget this word's old pairs
                p = (syms[k], syms[k + 1])
                pairs[p] -= cnt
                if pairs[p] <= 0:
                    del pairs[p]
                s = where.get(p)
                if s is not None:
                    s.discard(wi)
            new, k = [], 0
            while k < len(syms):
                if k < len(syms) - 1 and syms[k] == a and syms[k + 1] == b:
                    new.append(a + b)
                    k += 2
                else:
                    new.append(syms[k])
                    k += 1
            words[wi] = new
            for k in range(len(new) - 1):
                p = (new[k], new[k + 1])
                pairs[p] = pairs.get(p, 0) + cnt
                where.setdefault(p, set()).add(wi)
        pairs.pop((a, b), None)
        if log and len(merges) % 500 == 0:
            log(f"bpe: {len(merges)} merges, last {a + b!r} x{c}")
    token_type = [T_NORMAL] * len(tokens)
    for t, ty in SPECIALS:
        tokens.append(t)
        token_type.append(ty)
    return Tokenizer(tokens, token_type, merges, pre)


def chat(prompt, answer, image=False):
    """The training chat template (thinking off), with an empty image block."""
    img = "<image></image>\n" if image else ""
    return (f"<|im_start|>user\n{img}{prompt}<|im_end|>\n<|im_start|>assistant\n"
            f"<think>\n\n</think>\n\n{answer}<|im_end|>")


def corpus(n):
    sys.path.insert(0, HERE)
    import synth
    for i in range(n):
        s = synth.sample("train", i)
        yield chat(s["prompt"], s["answer"], s["image"] is not None)


def save(tok, path):
    special = {t: tok.ids[t] for t, _ in SPECIALS}
    d = {"pre": tok.pre, "tokens": tok.tokens, "token_type": tok.token_type,
         "merges": tok.merges, "special": special,
         "bos": "<|endoftext|>", "eos": "<|im_end|>", "pad": "<|endoftext|>",
         "unk": "<unk>", "add_bos": False}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, path)


@functools.lru_cache(maxsize=1)
def default():
    """The committed proving-model tokenizer (scripts/data/tokenizer.json)."""
    return Tokenizer.load(DEFAULT_PATH)


def selftest(tok, n=300, seed=1):
    """Round trips: random text over many scripts, specials, arbitrary bytes."""
    import random
    rng = random.Random(seed)
    alphabet = ("abcXYZ 019'\n\r\t.,!?-$%" + "éüñ中文字\u0301\u00a0\u2003🙂" + "<>|_/")
    bad = 0
    for k in range(n):
        m = rng.randint(0, 40)
        if k % 3 == 0:
            s = "".join(chr(rng.choice([rng.randint(1, 0x7F), rng.randint(0x80, 0x2FFF),
                                        rng.randint(0x1F300, 0x1F6FF)])) for _ in range(m))
        else:
            s = "".join(rng.choice(alphabet) for _ in range(m))
        if "".join(pretokenize(s, tok.pre)) != s:
            print(f"pretokenize lost text: {s!r}", file=sys.stderr)
            bad += 1
        ids = tok.encode(s, special=False)
        if tok.decode(ids) != s:
            print(f"round trip failed: {s!r} -> {tok.decode(ids)!r}", file=sys.stderr)
            bad += 1
    # arbitrary bytes: every byte has a token, so any byte string decodes back
    for _ in range(50):
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
        ids = [tok.ids[B2U[b]] for b in raw]
        if tok.decode_bytes(ids) != raw:
            bad += 1
    t = "<|im_start|>user\n<image></image>\nRead all text.<|im_end|>"
    ids = tok.encode(t)
    if tok.decode(ids) != t or ids[0] != tok.special["<|im_start|>"]:
        print("special token handling failed", file=sys.stderr)
        bad += 1
    return bad


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="bpe.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--n", type=int, default=12000, help="training samples to read")
    t.add_argument("--vocab", type=int, default=2048)
    t.add_argument("--pre", default="qwen35", choices=["qwen35", "qwen2"])
    t.add_argument("--out", default=DEFAULT_PATH)
    e = sub.add_parser("encode")
    e.add_argument("text")
    e.add_argument("--tokenizer", default=DEFAULT_PATH)
    s = sub.add_parser("selftest")
    s.add_argument("--tokenizer", default=DEFAULT_PATH)
    s.add_argument("--n", type=int, default=300)
    a = ap.parse_args(argv)
    if a.cmd == "train":
        tok = train(corpus(a.n), a.vocab, a.pre, log=lambda m: print(m, file=sys.stderr))
        save(tok, a.out)
        print(f"bpe: {len(tok.tokens)} tokens ({len(tok.merges)} merges) -> {a.out}",
              file=sys.stderr)
        return 0
    tok = Tokenizer.load(a.tokenizer)
    if a.cmd == "encode":
        ids = tok.encode(a.text)
        print(" ".join(map(str, ids)))
        print(" ".join(repr(tok.decode([i])) for i in ids), file=sys.stderr)
        return 0
    bad = selftest(tok, a.n)
    print(f"bpe selftest: {'ok' if not bad else f'{bad} failures'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
