#!/usr/bin/python3
"""gguf.py against ggml itself (libggml-base.so of the peer): Q8_0/Q4_0 quantization
must be byte-identical to quantize_row_*_ref, and every dequantizer must equal ggml's.
Also a write/read round trip. Exit 77 when the peer library is absent."""
import ctypes
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf as G  # noqa: E402

LIB = os.path.join(HERE, '..', 'peer', 'node_modules', '@node-llama-cpp', 'linux-x64', 'bins', 'linux-x64',
                   'libggml-base.so')


def main():
    rng = np.random.default_rng(7)
    bad = 0
    # round trip through a file
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, 't.gguf')
        w = G.Writer(p)
        w.kv('general.architecture', G.STR, 'test')
        w.kv('x.arr', (G.ARR, G.I32), [3, 3, 2, 0])
        ref = {}
        for t in (G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_0):
            a = rng.standard_normal((3, 64)).astype(np.float32)
            w.tensor(f't{t}', a, t)
            ref[t] = a
        w.close()
        g = G.read(p)
        if g.kv['x.arr'] != [3, 3, 2, 0]:
            print('round trip: kv array differs')
            bad += 1
        for t, a in ref.items():
            err = np.abs(g.tensors[f't{t}'] - a).max() / np.abs(a).max()
            lim = {G.F32: 0, G.F16: 1e-3, G.BF16: 8e-3, G.Q8_0: 1e-2, G.Q4_0: 0.15}[t]
            if g.tensors[f't{t}'].shape != a.shape or err > lim:
                print(f'round trip {G.TYPE_NAME[t]}: relative error {err:.3g} > {lim}')
                bad += 1
    if not os.path.exists(LIB):
        print('check_gguf: libggml-base.so of the peer absent (scripts/setup.sh installs it)', file=sys.stderr)
        return 77 if not bad else 1
    L = ctypes.CDLL(LIB)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    x = (rng.standard_normal(256 * 64) * rng.uniform(0.01, 3, 256 * 64)).astype(np.float32)
    x[:32] = 0
    x[32:64] = 1e-30
    for name, t, bs in (('q8_0', G.Q8_0, 34), ('q4_0', G.Q4_0, 18)):
        out = np.zeros(len(x) // 32 * bs, np.uint8)
        getattr(L, f'quantize_row_{name}_ref')(ptr(x), ptr(out), ctypes.c_int64(len(x)))
        mine = np.frombuffer(G.encode(x, t), np.uint8)
        if not np.array_equal(out, mine):
            print(f'{name}: {(out != mine).sum()} bytes differ from quantize_row_{name}_ref')
            bad += 1
    for name, t in (('q8_0', G.Q8_0), ('q4_0', G.Q4_0), ('q4_1', G.Q4_1), ('q5_0', G.Q5_0), ('q5_1', G.Q5_1),
                    ('q2_K', G.Q2_K), ('q3_K', G.Q3_K), ('q4_K', G.Q4_K), ('q5_K', G.Q5_K), ('q6_K', G.Q6_K)):
        qk, bs = G.BLOCK[t]
        nb = 64 * 32 // qk
        raw = rng.integers(0, 256, nb * bs, dtype=np.uint8).reshape(nb, bs)
        # finite fp16 scales where the format keeps them
        dpos = {G.Q6_K: [208], G.Q2_K: [80, 82], G.Q3_K: [108]}.get(t, [0, 2] if t in (G.Q4_1, G.Q5_1, G.Q4_K, G.Q5_K) else [0])
        for dp in dpos:
            raw[:, dp:dp + 2] = np.frombuffer(rng.uniform(-0.1, 0.1, nb).astype('<f2').tobytes(), np.uint8).reshape(nb, 2)
        raw = np.ascontiguousarray(raw.reshape(-1))
        deq = np.zeros(nb * qk, np.float32)
        getattr(L, f'dequantize_row_{name}')(ptr(raw), ptr(deq), ctypes.c_int64(nb * qk))
        mine = G._dequant(t, raw.tobytes(), nb * qk)
        if not np.array_equal(deq, mine):
            print(f'{name}: dequantization differs from ggml (max {np.abs(deq - mine).max():.3g})')
            bad += 1
    print('check_gguf: ' + ('ok' if not bad else f'{bad} failures'))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
