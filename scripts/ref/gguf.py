#!/usr/bin/python3
"""GGUF v3 read/write in numpy, for the reference model.

    read(path) -> GGUF(kv: dict, tensors: dict name -> np.float32 array in PyTorch
                  order (reverse of ggml ne), types: dict name -> ggml type id)
    Writer(path).kv(key, type, value) ... .tensor(name, array, qtype) ... .close()

Dequantizes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
Quantizes F32, F16, BF16, Q8_0, Q4_0 with ggml's reference rounding, so files
written here are bit-identical to what ggml's quantize_row_*_ref would produce.

    python3 scripts/ref/gguf.py FILE.gguf      # list metadata and tensors
"""
import os
import struct
import sys

import numpy as np

# value types
U8, I8, U16, I16, U32, I32, F32V, BOOL, STR, ARR, U64, I64, F64 = range(13)
_SCAL = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32V: '<f', BOOL: '<?',
         U64: '<Q', I64: '<q', F64: '<d'}

# ggml types
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 10, 11, 12, 13, 14, 30
TYPE_NAME = {F32: 'F32', F16: 'F16', Q4_0: 'Q4_0', Q4_1: 'Q4_1', Q5_0: 'Q5_0', Q5_1: 'Q5_1', Q8_0: 'Q8_0',
             Q2_K: 'Q2_K', Q3_K: 'Q3_K', Q4_K: 'Q4_K', Q5_K: 'Q5_K', Q6_K: 'Q6_K', BF16: 'BF16'}
# (block elements, block bytes)
BLOCK = {F32: (1, 4), F16: (1, 2), BF16: (1, 2), Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22),
         Q5_1: (32, 24), Q8_0: (32, 34), Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176),
         Q6_K: (256, 210)}


class GGUF:
    def __init__(self):
        self.kv = {}
        self.kv_types = {}
        self.tensors = {}
        self.types = {}
        self.shapes = {}     # ggml ne


class _Reader:
    def __init__(self, buf):
        self.b = buf
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)
        self.o += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.take('<Q')
        s = bytes(self.b[self.o:self.o + n]).decode('utf-8', errors='surrogateescape')
        self.o += n
        return s

    def value(self, t):
        if t == STR:
            return self.string()
        if t == ARR:
            et = self.take('<I')
            n = self.take('<Q')
            if et in _SCAL and et != BOOL:
                dt = np.dtype(_SCAL[et])
                a = np.frombuffer(self.b, dtype=dt, count=n, offset=self.o)
                self.o += n * dt.itemsize
                return a.tolist()
            return [self.value(et) for _ in range(n)]
        return self.take(_SCAL[t])


def _f16(b):
    return np.frombuffer(b, dtype='<f2').astype(np.float32)


def _dequant(t, raw, n):
    if t == F32:
        return np.frombuffer(raw, dtype='<f4', count=n).copy()
    if t == F16:
        return _f16(raw[:2 * n])
    if t == BF16:
        u = np.frombuffer(raw, dtype='<u2', count=n).astype(np.uint32) << 16
        return u.view(np.float32)
    qk, bs = BLOCK[t]
    nb = n // qk
    blk = np.frombuffer(raw, dtype=np.uint8, count=nb * bs).reshape(nb, bs)
    if t == Q8_0:
        d = _f16(blk[:, :2].tobytes())[:, None]
        return (blk[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)
    if t in (Q4_0, Q4_1):
        d = _f16(blk[:, :2].tobytes())[:, None]
        qs = blk[:, 4 if t == Q4_1 else 2:]
        q = np.concatenate([qs & 15, qs >> 4], 1).astype(np.float32)
        if t == Q4_0:
            return ((q - 8) * d).reshape(-1)
        m = _f16(blk[:, 2:4].tobytes())[:, None]
        return (q * d + m).reshape(-1)
    if t in (Q5_0, Q5_1):
        d = _f16(blk[:, :2].tobytes())[:, None]
        off = 4 if t == Q5_1 else 2
        qh = blk[:, off:off + 4].copy().view('<u4')[:, 0]
        qs = blk[:, off + 4:]
        bits = (qh[:, None] >> np.arange(32, dtype=np.uint32)[None, :]) & 1
        lo = np.concatenate([qs & 15, qs >> 4], 1).astype(np.uint32)
        q = (lo | (bits << 4)).astype(np.float32)
        if t == Q5_0:
            return ((q - 16) * d).reshape(-1)
        m = _f16(blk[:, 2:4].tobytes())[:, None]
        return (q * d + m).reshape(-1)
    if t == Q2_K:
        sc = blk[:, 0:16]
        qs = blk[:, 16:80]
        d = _f16(blk[:, 80:82].tobytes())[:, None]
        dmin = _f16(blk[:, 82:84].tobytes())[:, None]
        out = np.zeros((nb, 256), np.float32)
        for h in range(2):
            q = qs[:, 32 * h:32 * h + 32]
            for j in range(4):
                for part in range(2):
                    s_ = sc[:, 8 * h + 2 * j + part][:, None]
                    v = (q[:, 16 * part:16 * part + 16] >> (2 * j)) & 3
                    o = 128 * h + 32 * j + 16 * part
                    out[:, o:o + 16] = d * (s_ & 15) * v - dmin * (s_ >> 4)
        return out.reshape(-1)
    if t == Q3_K:
        hm = blk[:, 0:32]
        qs = blk[:, 32:96]
        a = blk[:, 96:108].copy().view('<u4').astype(np.uint32)       # (nb, 3)
        d = _f16(blk[:, 108:110].tobytes())[:, None]
        k1, k2 = np.uint32(0x03030303), np.uint32(0x0f0f0f0f)
        tmp = a[:, 2]
        aux = np.stack([(a[:, 0] & k2) | (((tmp >> 0) & k1) << 4), (a[:, 1] & k2) | (((tmp >> 2) & k1) << 4),
                        ((a[:, 0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
                        ((a[:, 1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)], 1).astype('<u4')
        scales = aux.view(np.int8).astype(np.float32) - 32                # (nb, 16)
        out = np.zeros((nb, 256), np.float32)
        for h in range(2):
            q = qs[:, 32 * h:32 * h + 32]
            for j in range(4):
                m = 1 << (4 * h + j)
                for part in range(2):
                    sl = slice(16 * part, 16 * part + 16)
                    v = ((q[:, sl] >> (2 * j)) & 3).astype(np.float32) - np.where(hm[:, sl] & m, 0, 4)
                    o = 128 * h + 32 * j + 16 * part
                    out[:, o:o + 16] = d * scales[:, 8 * h + 2 * j + part][:, None] * v
        return out.reshape(-1)
    if t in (Q4_K, Q5_K):
        d = _f16(blk[:, 0:2].tobytes())[:, None]
        dmin = _f16(blk[:, 2:4].tobytes())[:, None]
        sc = blk[:, 4:16].astype(np.uint32)
        # 8 six-bit scales and mins packed in 12 bytes
        scales = np.zeros((nb, 8), np.float32)
        mins = np.zeros((nb, 8), np.float32)
        for j in range(8):
            if j < 4:
                scales[:, j] = sc[:, j] & 63
                mins[:, j] = sc[:, j + 4] & 63
            else:
                scales[:, j] = (sc[:, j + 4] & 0xF) | ((sc[:, j - 4] >> 6) << 4)
                mins[:, j] = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
        if t == Q4_K:
            qs = blk[:, 16:144]
            out = np.zeros((nb, 256), np.float32)
            for i in range(4):           # 64 values per 32 bytes
                b = qs[:, 32 * i:32 * i + 32]
                out[:, 64 * i:64 * i + 32] = (b & 15) * (d * scales[:, 2 * i:2 * i + 1]) - dmin * mins[:, 2 * i:2 * i + 1]
                out[:, 64 * i + 32:64 * i + 64] = (b >> 4) * (d * scales[:, 2 * i + 1:2 * i + 2]) - dmin * mins[:, 2 * i + 1:2 * i + 2]
            return out.reshape(-1)
        qh = blk[:, 16:48]
        qs = blk[:, 48:176]
        out = np.zeros((nb, 256), np.float32)
        for i in range(4):
            b = qs[:, 32 * i:32 * i + 32]
            h1 = ((qh >> (2 * i)) & 1) << 4
            h2 = ((qh >> (2 * i + 1)) & 1) << 4
            out[:, 64 * i:64 * i + 32] = ((b & 15) + h1) * (d * scales[:, 2 * i:2 * i + 1]) - dmin * mins[:, 2 * i:2 * i + 1]
            out[:, 64 * i + 32:64 * i + 64] = ((b >> 4) + h2) * (d * scales[:, 2 * i + 1:2 * i + 2]) - dmin * mins[:, 2 * i + 1:2 * i + 2]
        return out.reshape(-1)
    if t == Q6_K:
        ql = blk[:, 0:128]
        qh = blk[:, 128:192]
        sc = blk[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(blk[:, 208:210].tobytes())[:, None]
        out = np.zeros((nb, 256), np.float32)
        for h in range(2):               # two halves of 128
            l = ql[:, 64 * h:64 * h + 64]
            hh = qh[:, 32 * h:32 * h + 32]
            s = sc[:, 8 * h:8 * h + 8]
            q1 = ((l[:, :32] & 15) | ((hh & 3) << 4)).astype(np.int32) - 32
            q2 = ((l[:, 32:] & 15) | (((hh >> 2) & 3) << 4)).astype(np.int32) - 32
            q3 = ((l[:, :32] >> 4) | (((hh >> 4) & 3) << 4)).astype(np.int32) - 32
            q4 = ((l[:, 32:] >> 4) | (((hh >> 6) & 3) << 4)).astype(np.int32) - 32
            base = 128 * h
            for k, q in enumerate((q1, q2, q3, q4)):
                # 16-element groups: scale index 2k + (element >= 16)
                out[:, base + 32 * k:base + 32 * k + 16] = d * s[:, 2 * k:2 * k + 1] * q[:, :16]
                out[:, base + 32 * k + 16:base + 32 * k + 32] = d * s[:, 2 * k + 1:2 * k + 2] * q[:, 16:]
        return out.reshape(-1)
    raise ValueError(f'gguf: unsupported tensor type {t}')


def read(path, load=True):
    with open(path, 'rb') as f:
        buf = f.read()
    r = _Reader(memoryview(buf))
    if bytes(buf[:4]) != b'GGUF':
        raise ValueError(f'{path}: not a GGUF file')
    r.o = 4
    ver = r.take('<I')
    if ver != 3:
        raise ValueError(f'{path}: GGUF version {ver} (want 3)')
    nt = r.take('<Q')
    nkv = r.take('<Q')
    g = GGUF()
    for _ in range(nkv):
        k = r.string()
        t = r.take('<I')
        g.kv[k] = r.value(t)
        g.kv_types[k] = t
    infos = []
    for _ in range(nt):
        name = r.string()
        nd = r.take('<I')
        ne = [r.take('<Q') for _ in range(nd)]
        t = r.take('<I')
        off = r.take('<Q')
        infos.append((name, ne, t, off))
    align = int(g.kv.get('general.alignment', 32))
    base = (r.o + align - 1) // align * align
    for name, ne, t, off in infos:
        g.types[name] = t
        g.shapes[name] = ne
        if not load:
            continue
        n = int(np.prod(ne))
        qk, bs = BLOCK[t]
        raw = buf[base + off: base + off + n // qk * bs]
        g.tensors[name] = _dequant(t, raw, n).reshape(list(reversed(ne)))
    return g


# ------------------------------------------------------------------ writing

def _round_away(x):
    # C roundf: half away from zero
    return np.trunc(x + np.copysign(0.5, x))


def quant_q8_0(x):
    x = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(x).max(1)
    d = amax / 127.0
    idv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = _round_away(x * idv[:, None]).astype(np.int8)
    out = np.zeros((x.shape[0], 34), np.uint8)
    out[:, :2] = d.astype('<f2').view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quant_q4_0(x):
    x = x.reshape(-1, 32).astype(np.float32)
    idx = np.abs(x).argmax(1)
    mx = x[np.arange(x.shape[0]), idx]
    d = mx / -8.0
    idv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, np.trunc(x * idv[:, None] + 8.5)).astype(np.int32)   # C cast truncates (value >= 0)
    q = np.clip(q, 0, 15).astype(np.uint8)
    out = np.zeros((x.shape[0], 18), np.uint8)
    out[:, :2] = d.astype('<f2').view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def _bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    # round to nearest even, as ggml_fp32_to_bf16 (NaN kept quiet)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r[nan] = ((u[nan] >> 16) | 64).astype(np.uint16)
    return r.tobytes()


def encode(x, t):
    x = np.ascontiguousarray(x, dtype=np.float32)
    if t == F32:
        return x.astype('<f4').tobytes()
    if t == F16:
        return x.astype('<f2').tobytes()
    if t == BF16:
        return _bf16(x)
    if t == Q8_0:
        return quant_q8_0(x)
    if t == Q4_0:
        return quant_q4_0(x)
    raise ValueError(f'gguf: cannot write type {t}')


class Writer:
    """Collects metadata and tensors, then writes the file via a temp file + rename."""

    def __init__(self, path, align=32):
        self.path = path
        self.align = align
        self.kvs = []
        self.tens = []

    def kv(self, key, typ, value):
        self.kvs.append((key, typ, value))

    def tensor(self, name, arr, t=F32):
        arr = np.asarray(arr, dtype=np.float32)
        ne = list(reversed(arr.shape))
        qk, _ = BLOCK[t]
        if ne[0] % qk:
            raise ValueError(f'{name}: row length {ne[0]} not a multiple of {qk} for {TYPE_NAME[t]}')
        self.tens.append((name, ne, t, encode(arr, t)))

    @staticmethod
    def _str(s):
        b = s.encode('utf-8')
        return struct.pack('<Q', len(b)) + b

    def _val(self, typ, v):
        if typ == STR:
            return self._str(v)
        if isinstance(typ, tuple):
            et = typ[1]
            return struct.pack('<IQ', et, len(v)) + b''.join(self._val(et, x) for x in v)
        return struct.pack(_SCAL[typ], v)

    def close(self):
        out = bytearray(b'GGUF')
        out += struct.pack('<IQQ', 3, len(self.tens), len(self.kvs))
        for k, typ, v in self.kvs:
            out += self._str(k) + struct.pack('<I', ARR if isinstance(typ, tuple) else typ) + self._val(typ, v)
        off = 0
        offs = []
        for name, ne, t, data in self.tens:
            out += self._str(name) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', n) for n in ne)
            out += struct.pack('<IQ', t, off)
            offs.append(off)
            off += (len(data) + self.align - 1) // self.align * self.align
        out += b'\0' * ((-len(out)) % self.align)
        tmp = self.path + '.tmp'
        with open(tmp, 'wb') as f:
            f.write(out)
            for name, ne, t, data in self.tens:
                f.write(data)
                f.write(b'\0' * ((-len(data)) % self.align))
        os.replace(tmp, self.path)


def main(argv):
    if len(argv) != 1:
        print('usage: gguf.py FILE.gguf', file=sys.stderr)
        return 2
    g = read(argv[0], load=False)
    for k, v in g.kv.items():
        s = repr(v)
        print(f'{k} = {s[:100]}{"..." if len(s) > 100 else ""}')
    for n, ne in g.shapes.items():
        print(f'{n} {TYPE_NAME.get(g.types[n], g.types[n])} {ne}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
