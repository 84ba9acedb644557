#!/usr/bin/python3
"""Write a random importance matrix for a GGUF model, for tests.

  mk-imatrix.py MODEL.gguf OUT [--gguf] [--seed N]

One entry per matrix (2-D and 3-D tensors named *.weight), with ne0 * ne2
positive values, in llama.cpp's legacy .dat format (default) or its GGUF
format (tensors NAME.in_sum2 and NAME.counts).  Only the tensor directory of
MODEL is read (a minimal GGUF parser)."""
import struct, sys
import numpy as np

def read_tensors(path):
    f = open(path, 'rb')
    def u(fmt):
        return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))[0]
    def s():
        return f.read(u('Q')).decode()
    sizes = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    def val(t):
        if t == 8:
            return s()
        if t == 9:
            et, n = u('I'), u('Q')
            return [val(et) for _ in range(n)]
        return u(sizes[t])
    assert f.read(4) == b'GGUF'
    u('I')
    nt, nkv = u('Q'), u('Q')
    for _ in range(nkv):
        s(); val(u('I'))
    out = []
    for _ in range(nt):
        name = s()
        nd = u('I')
        ne = [u('Q') for _ in range(nd)]
        u('I'); u('Q')
        out.append((name, ne))
    return out

def gguf_str(b):
    return struct.pack('<Q', len(b)) + b

def main():
    args = sys.argv[1:]
    fmt_gguf = '--gguf' in args
    seed = 1
    if '--seed' in args:
        seed = int(args[args.index('--seed') + 1])
    pos = [a for i, a in enumerate(args) if not a.startswith('--') and (i == 0 or args[i - 1] != '--seed')]
    model, out = pos[0], pos[1]
    rng = np.random.default_rng(seed)
    ents = []
    for name, ne in read_tensors(model):
        if len(ne) < 2 or not name.endswith('.weight') or ne[1] == 1:
            continue
        n_mat = ne[2] if len(ne) > 2 else 1
        vals = rng.uniform(0.01, 4.0, size=(n_mat, ne[0])).astype(np.float32)
        ents.append((name, ne[0], n_mat, vals))
    if not fmt_gguf:
        with open(out, 'wb') as f:
            f.write(struct.pack('<i', len(ents)))
            for name, ne0, n_mat, vals in ents:
                ncall = 10
                f.write(struct.pack('<i', len(name)) + name.encode())
                f.write(struct.pack('<ii', ncall, ne0 * n_mat))
                f.write((vals * ncall).astype(np.float32).tobytes())
        return
    # GGUF: counts per matrix; sums = mean * count
    tensors = []
    for name, ne0, n_mat, vals in ents:
        counts = rng.integers(1, 50, size=n_mat).astype(np.float32)
        counts[0] = 0 if n_mat > 2 else counts[0]  # a matrix never seen
        sums = vals * counts[:, None]
        tensors.append((name + '.in_sum2', [ne0, n_mat], sums.astype(np.float32).tobytes()))
        tensors.append((name + '.counts', [1, n_mat], counts.tobytes()))
    kv = gguf_str(b'general.type') + struct.pack('<I', 8) + gguf_str(b'imatrix')
    kv += gguf_str(b'imatrix.chunk_size') + struct.pack('<I', 4) + struct.pack('<I', 512)
    kv += gguf_str(b'imatrix.chunk_count') + struct.pack('<I', 4) + struct.pack('<I', 10)
    kv += gguf_str(b'imatrix.datasets') + struct.pack('<I', 9) + struct.pack('<IQ', 8, 1) + gguf_str(b'test')
    hdr = b'GGUF' + struct.pack('<IQQ', 3, len(tensors), 4) + kv
    off = 0
    infos = b''
    for name, ne, data in tensors:
        infos += gguf_str(name.encode()) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', x) for x in ne)
        infos += struct.pack('<IQ', 0, off)
        off += (len(data) + 31) // 32 * 32
    head = hdr + infos
    head += b'\0' * ((32 - len(head) % 32) % 32)
    with open(out, 'wb') as f:
        f.write(head)
        for name, ne, data in tensors:
            f.write(data + b'\0' * ((32 - len(data) % 32) % 32))

main()
