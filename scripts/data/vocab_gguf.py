#!/usr/bin/python3
"""The tokenizer as GGUF metadata, and a vocabulary-only GGUF for tests.

    vocab_gguf.py OUT.gguf [tokenizer.json]

tokenizer_kv(tok) gives the `tokenizer.ggml.*` keys llama.cpp reads for a
byte-level BPE ("gpt2") vocabulary, as (key, gguf type, value) triples, so a
model exporter can copy them.  The file written here is a `qwen35` GGUF with
no tensors and token-shaped hyperparameters: llama.cpp opens it with
vocab_only, which is enough to compare tokenizations.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR = range(10)


def tokenizer_kv(tok):
    sp = tok.special
    return [
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, tok.pre),
        ("tokenizer.ggml.tokens", (ARR, STR), tok.tokens),
        ("tokenizer.ggml.token_type", (ARR, I32), tok.token_type),
        ("tokenizer.ggml.merges", (ARR, STR), tok.merges),
        ("tokenizer.ggml.bos_token_id", U32, sp["<|endoftext|>"]),
        ("tokenizer.ggml.eos_token_id", U32, sp["<|im_end|>"]),
        ("tokenizer.ggml.padding_token_id", U32, sp["<|endoftext|>"]),
        ("tokenizer.ggml.add_bos_token", BOOL, False),
    ]


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
           F32: "<f", BOOL: "<?"}


def _value(typ, v):
    if typ == STR:
        return _str(v)
    if isinstance(typ, tuple):
        sub = typ[1]
        body = b"".join(_value(sub, x) for x in v)
        return struct.pack("<IQ", sub, len(v)) + body
    return struct.pack(_SCALAR[typ], v)


def encode_kv(key, typ, v):
    t = ARR if isinstance(typ, tuple) else typ
    return _str(key) + struct.pack("<I", t) + _value(typ, v)


def write_vocab_gguf(path, tok):
    arch = "qwen35"
    hp = [("general.architecture", STR, arch), ("general.name", STR, "mcv proving vocab"),
          (f"{arch}.context_length", U32, 2048), (f"{arch}.embedding_length", U32, 64),
          (f"{arch}.feed_forward_length", U32, 128), (f"{arch}.block_count", U32, 4),
          (f"{arch}.attention.head_count", U32, 2), (f"{arch}.attention.head_count_kv", U32, 1),
          (f"{arch}.attention.key_length", U32, 32), (f"{arch}.attention.value_length", U32, 32),
          (f"{arch}.attention.layer_norm_rms_epsilon", F32, 1e-6),
          (f"{arch}.rope.dimension_count", U32, 8),
          (f"{arch}.rope.dimension_sections", (ARR, I32), [2, 1, 1, 0]),
          (f"{arch}.rope.freq_base", F32, 1e6), (f"{arch}.ssm.conv_kernel", U32, 4),
          (f"{arch}.ssm.inner_size", U32, 64), (f"{arch}.ssm.state_size", U32, 16),
          (f"{arch}.ssm.time_step_rank", U32, 4), (f"{arch}.ssm.group_count", U32, 2),
          (f"{arch}.full_attention_interval", U32, 4)]
    kvs = hp + tokenizer_kv(tok)
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(encode_kv(*kv) for kv in kvs)
    data += b"\0" * (-len(data) % 32)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print("usage: vocab_gguf.py OUT.gguf [tokenizer.json]", file=sys.stderr)
        sys.exit(2)
    tok = bpe.Tokenizer.load(sys.argv[2]) if len(sys.argv) == 3 else bpe.default()
    write_vocab_gguf(sys.argv[1], tok)
