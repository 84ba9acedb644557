#!/usr/bin/python3
"""Run the reference on a GGUF model and dump what parity tests compare.

    dump.py --model TEXT.gguf (--tokens 1,2,3 | --prompt TEXT) [-n 16]
            [--mmproj MMPROJ.gguf --image IMG [--merge 4|2]] [--chat]
            [--out-dir DIR] [--double] [--recurrent]

stdout: one JSON object {"prompt_tokens", "tokens" (greedy, -n of them),
"text", "first_logits_top" ([id, logit] x 10)}.
--out-dir DIR writes .npy files (little-endian, C order, readable with a
few lines of C):
  prompt_tokens.npy  int32 [T]        (-1 where image embeddings go)
  tokens.npy         int32 [n]        greedy continuation
  first_logits.npy   float32 [V]      logits after the last prompt token
  logits.npy         float32 [T, V]   logits at every prompt position
  hidden.npy         float32 [L+1, T, H]  input of every layer, then the last layer's output
  out_norm.npy       float32 [T, H]   after output_norm
  positions.npy      int32 [T, 4]     M-RoPE positions (t, h, w, e)
  image_embd.npy     float32 [N, H]   projector output of all crops (with --image)
  crop_K.npy         float32 [3, h, w] normalized pixels of crop K (0 = overview, then tiles row-major)
--prompt is tokenized raw (special tokens parsed); --chat wraps it in the
chat template (thinking off), with the image block when --image is given.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import export   # noqa: E402
import chatfmt  # noqa: E402
from model import text_positions   # noqa: E402


def tokenizer_from_gguf(path):
    import bpe
    g = export.G.read(path, load=False)
    kv = g.kv
    return bpe.Tokenizer(kv['tokenizer.ggml.tokens'], kv['tokenizer.ggml.token_type'], kv['tokenizer.ggml.merges'],
                         kv.get('tokenizer.ggml.pre', 'qwen35'))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--mmproj')
    ap.add_argument('--image')
    ap.add_argument('--merge', type=int, default=None)
    ap.add_argument('--tokens')
    ap.add_argument('--prompt')
    ap.add_argument('--chat', action='store_true')
    ap.add_argument('-n', type=int, default=16)
    ap.add_argument('--out-dir')
    ap.add_argument('--double', action='store_true')
    ap.add_argument('--recurrent', action='store_true', help='prefill token by token (decode form)')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = torch.float64 if a.double else torch.float32
    m = export.load(a.model, a.mmproj, dt)
    m.eval()
    tok = tokenizer_from_gguf(a.model)
    crops_emb = None
    with torch.no_grad():
        if a.tokens is not None:
            ids = [int(x) for x in a.tokens.split(',')]
            sq = dict(ids=ids, pos=text_positions(len(ids)), img_spans=[], crops=[], merge=None)
        else:
            if a.prompt is None:
                sys.exit('dump: need --tokens or --prompt')
            if a.chat or a.image:
                s = dict(prompt=a.prompt, answer=None, image=None)
                if a.image:
                    from PIL import Image
                    s['image'] = Image.open(a.image)
                sq = chatfmt.encode_sample(tok, s, m.vc, a.merge)
            else:
                ids = tok.encode(a.prompt)
                sq = dict(ids=ids, pos=text_positions(len(ids)), img_spans=[], crops=[], merge=None)
        ids = torch.tensor(sq['ids'])
        e = m.text.embed[ids.clamp_min(0)]
        parts, last, feats = [], 0, []
        for start, ci in sq['img_spans']:
            f, _ = m.vision(sq['crops'][ci][None].to(dt), sq['merge'])
            feats.append(f[0])
            parts += [e[last:start], f[0]]
            last = start + f.shape[1]
        parts.append(e[last:])
        e = torch.cat(parts, 0)[None]
        if feats:
            crops_emb = torch.cat(feats, 0)
        pos = sq['pos'][None]
        caches = m.text.new_caches()
        hidden = []
        if a.recurrent:
            hs = []
            for t in range(e.shape[1]):
                hs.append(m.text(e[:, t:t + 1], pos[:, t:t + 1], caches, 'recurrent'))
            h = torch.cat(hs, 1)
            hidden = None
        else:
            h = m.text(e, pos, caches, 'chunked', hidden_out=hidden)
        logits = m.text.logits(h)[0]
        first = logits[-1]
        out = []
        nxt = int(first.argmax())
        p = int(pos[0, :, 0].max()) + 1 if not sq.get('next_pos') else int(sq['next_pos'])
        for i in range(a.n):
            out.append(nxt)
            if i == a.n - 1:
                break
            hh = m.text(m.text.embed[torch.tensor([[nxt]])], text_positions(1, p)[None], caches, 'recurrent')
            p += 1
            nxt = int(m.text.logits(hh[:, -1])[0].argmax())
    top = torch.topk(first.float(), 10)
    res = dict(prompt_tokens=[int(x) for x in sq['ids']], tokens=out, text=tok.decode(out),
               first_logits_top=[[int(i), float(v)] for v, i in zip(top.values, top.indices)])
    print(json.dumps(res))
    if a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
        sv = lambda n, x, t: np.save(os.path.join(a.out_dir, n), np.ascontiguousarray(x, dtype=t))
        sv('prompt_tokens.npy', np.array(sq['ids']), '<i4')
        sv('tokens.npy', np.array(out), '<i4')
        sv('first_logits.npy', first.float().numpy(), '<f4')
        sv('logits.npy', logits.float().numpy(), '<f4')
        sv('out_norm.npy', h[0].float().numpy(), '<f4')
        sv('positions.npy', sq['pos'].numpy(), '<i4')
        if hidden:
            sv('hidden.npy', torch.stack([x[0] for x in hidden]).float().numpy(), '<f4')
        if crops_emb is not None:
            sv('image_embd.npy', crops_emb.float().numpy(), '<f4')
            # the normalized pixels each crop was computed from (PIL bicubic resize; llama.cpp's
            # own bicubic differs slightly, so vision parity tests should feed these exact pixels)
            for ci, c in enumerate(sq['crops']):
                sv(f'crop_{ci}.npy', c.numpy(), '<f4')


if __name__ == '__main__':
    main()
