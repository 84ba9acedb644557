#!/usr/bin/python3
"""Write a vocabulary-only GGUF (general.architecture "qwen35", no tensors)
with a byte-level BPE tokenizer trained here on a small multilingual text, so
tokenizer tests exercise real merges over ASCII, digits, accents, combining
marks, CJK and emoji.  llama.cpp loads it with vocab_only.

    /usr/bin/python3 scripts/mk-test-vocab.py OUT.gguf [N_MERGES] [PRE]

PRE is the tokenizer.ggml.pre value (default qwen35).  Output is
deterministic for given arguments.  OUT.txt gets the same vocabulary as
text (see the end of main).
"""
import collections
import struct
import sys

CORPUS = """
The quick brown fox jumps over the lazy dog. It's a dog's life, isn't it?
They're here; we've been there; I'll go, you'd stay, I'm done. DON'T SHOUT!
Receipt #00123: 2 x coffee @ 3.50 = 7.00 EUR, total 1234567.89, date 2026-11-29.
def main(argv):\n    for i in range(10):\n        print(i * 2)  # comment\n    return 0
Café crème, naïve façade, résumé, über, Ångström, São Paulo, Dvořák, Łódź.
e\u0301 a\u0300 o\u0308 n\u0303 combining marks: cafe\u0301, nai\u0308ve.
你好，世界！今天是2026年11月29日。我们在测试分词器，中文文本很重要。
日本語のテキストもあります。カタカナとひらがな、漢字。
한국어 문장도 있습니다. 안녕하세요.
Привет, мир! Съешь же ещё этих мягких французских булок.
Γειά σου κόσμε. مرحبا بالعالم. שלום עולם.
नमस्ते दुनिया, हिन्दी में पाठ। สวัสดีครับ ผมชื่อ
Emoji: 😀 😂 👍🏽 🎉🎉 ❤️ 👨‍👩‍👧 flags 🇫🇷 🇯🇵
   leading spaces and\ttabs\t\tand\r\nwindows lines\n\n\nblank lines   
<html><body class="x">a &amp; b</body></html> {"key": [1, 2, 3]} ... !!! ???
"""


def bytes_to_unicode():
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, extra = {}, 0
    for b in range(256):
        if b in keep:
            m[b] = chr(b)
        else:
            m[b] = chr(256 + extra)
            extra += 1
    return m


def rough_words(text):
    # Training only needs plausible words; the exact split rules live in C.
    out, cur, kind = [], "", None
    for ch in text:
        k = "a" if ch.isalpha() else "d" if ch.isdigit() else "s" if ch.isspace() else "p"
        if cur and (k != kind or k == "d") and not (kind == "s" and k == "a" and cur == " "):
            out.append(cur)
            cur = ""
        cur += ch
        kind = k
    if cur:
        out.append(cur)
    return out


def train(n_merges):
    b2u = bytes_to_unicode()
    words = collections.Counter()
    for w in rough_words(CORPUS * 3):
        words[tuple(b2u[b] for b in w.encode("utf-8"))] += 1
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        new = collections.Counter()
        for w, c in words.items():
            o, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    o.append(w[i] + w[i + 1])
                    i += 2
                else:
                    o.append(w[i])
                    i += 1
            new[tuple(o)] += c
        words = new
    return b2u, merges


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, payload):
    return gguf_str(key) + struct.pack("<I", typ) + payload


def main():
    out = sys.argv[1]
    n_merges = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    pre = sys.argv[3] if len(sys.argv) > 3 else "qwen35"
    b2u, merges = train(n_merges)
    tokens = [b2u[b] for b in range(256)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
    types = [1] * len(tokens)
    for name, ty in (("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3),
                     ("<think>", 4), ("</think>", 4), ("<image>", 3), ("</image>", 3)):
        tokens.append(name)
        types.append(ty)
    eos = tokens.index("<|endoftext|>")
    while len(tokens) % 64:
        tokens.append("[PAD%d]" % len(tokens))
        types.append(5)
    kvs = [
        kv("general.architecture", 8, gguf_str("qwen35")),
        kv("general.name", 8, gguf_str("mcv test vocabulary")),
        # Hyperparameters of a tiny qwen35 shape: llama.cpp reads them even
        # for a vocab-only load.
        kv("qwen35.context_length", 4, struct.pack("<I", 4096)),
        kv("qwen35.embedding_length", 4, struct.pack("<I", 64)),
        kv("qwen35.feed_forward_length", 4, struct.pack("<I", 128)),
        kv("qwen35.block_count", 4, struct.pack("<I", 4)),
        kv("qwen35.attention.head_count", 4, struct.pack("<I", 2)),
        kv("qwen35.attention.head_count_kv", 4, struct.pack("<I", 1)),
        kv("qwen35.attention.key_length", 4, struct.pack("<I", 32)),
        kv("qwen35.attention.value_length", 4, struct.pack("<I", 32)),
        kv("qwen35.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-6)),
        kv("qwen35.rope.dimension_count", 4, struct.pack("<I", 8)),
        kv("qwen35.rope.dimension_sections", 9, struct.pack("<IQ4i", 5, 4, 2, 1, 1, 0)),
        kv("qwen35.rope.freq_base", 6, struct.pack("<f", 1e7)),
        kv("qwen35.ssm.conv_kernel", 4, struct.pack("<I", 4)),
        kv("qwen35.ssm.inner_size", 4, struct.pack("<I", 64)),
        kv("qwen35.ssm.state_size", 4, struct.pack("<I", 16)),
        kv("qwen35.ssm.time_step_rank", 4, struct.pack("<I", 4)),
        kv("qwen35.ssm.group_count", 4, struct.pack("<I", 2)),
        kv("qwen35.full_attention_interval", 4, struct.pack("<I", 4)),
        kv("tokenizer.ggml.model", 8, gguf_str("gpt2")),
        kv("tokenizer.ggml.pre", 8, gguf_str(pre)),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(gguf_str(t) for t in tokens)),
        kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(types)) + struct.pack("<%di" % len(types), *types)),
        kv("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, len(merges)) + b"".join(gguf_str(a + " " + b) for a, b in merges)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", eos)),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", eos)),
        kv("tokenizer.ggml.padding_token_id", 4, struct.pack("<I", eos)),
        kv("tokenizer.ggml.add_bos_token", 7, struct.pack("<B", 0)),
    ]
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    data += b"\0" * (-len(data) % 32)
    with open(out, "wb") as f:
        f.write(data)
    # The same vocabulary as text, so C tests need no GGUF reader:
    # "T type hex(text)" per token, then "M hex(left right)" per merge.
    with open(out + ".txt", "w") as f:
        for t, ty in zip(tokens, types):
            f.write("T %d %s\n" % (ty, t.encode("utf-8").hex()))
        for a, b in merges:
            f.write("M %s\n" % (a + " " + b).encode("utf-8").hex())


main()
