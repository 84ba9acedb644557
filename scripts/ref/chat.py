#!/usr/bin/python3
"""Chat with the reference model, or write predictions for scripts/eval.py.

    chat.py (--model TEXT.gguf [--mmproj MMPROJ.gguf] | --ckpt C.pt) [--image IMG] -p PROMPT
    chat.py (...) --split test|--seed N --n N [--task all] --out PRED.jsonl [--merge 4|2]
        then: scripts/eval.py --seed N --n N --task all PRED.jsonl

Greedy decoding, thinking off, the chat template of chatfmt.py.
"""
import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import chatfmt   # noqa: E402
import compact   # noqa: E402
from model import MiniCPMV, text_positions   # noqa: E402


def load_any(a):
    if a.ckpt:
        d = compact.load(a.ckpt)   # a compact checkpoint too
        m = MiniCPMV.from_config(d['config'])
        m.load_state_dict(d['model'])
        import bpe
        tok = bpe.default()
    else:
        import export
        import dump
        m = export.load(a.model, a.mmproj)
        tok = dump.tokenizer_from_gguf(a.model)
    m.eval()
    return m, tok


@torch.no_grad()
def answer(m, tok, sample, merge=None, max_new=256, feats=None):
    """Greedy answer; feats: {crop index: rows} to read instead of the tower's (code_eval.py)."""
    sq = chatfmt.encode_sample(tok, dict(sample, answer=None), m.vc, merge)
    ids = torch.tensor(sq['ids'])
    e = m.text.embed[ids.clamp_min(0)]
    parts, last = [], 0
    for start, ci in sq['img_spans']:
        f = feats[ci] if feats is not None else m.vision(sq['crops'][ci][None], sq['merge'])[0][0]
        parts += [e[last:start], f]
        last = start + f.shape[0]
    parts.append(e[last:])
    e = torch.cat(parts, 0)[None]
    caches = m.text.new_caches()
    h = m.text(e, sq['pos'][None], caches, 'chunked')
    nxt = int(m.text.logits(h[:, -1]).argmax(-1))
    p, out, end = sq['next_pos'], [], tok.id('<|im_end|>')
    for _ in range(max_new):
        if nxt == end:
            break
        out.append(nxt)
        h = m.text(m.text.embed[torch.tensor([[nxt]])], text_positions(1, p)[None], caches, 'recurrent')
        p += 1
        nxt = int(m.text.logits(h[:, -1]).argmax(-1))
    return tok.decode(out, special=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model')
    ap.add_argument('--mmproj')
    ap.add_argument('--ckpt')
    ap.add_argument('--image')
    ap.add_argument('-p', '--prompt')
    ap.add_argument('--merge', type=int, default=None)
    ap.add_argument('--split')
    ap.add_argument('--seed', type=int)
    ap.add_argument('--n', type=int, default=10)
    ap.add_argument('--task', default='all')
    ap.add_argument('--start', type=int, default=0)
    ap.add_argument('--out')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    m, tok = load_any(a)
    if a.prompt is not None:
        s = dict(prompt=a.prompt, image=None)
        if a.image:
            from PIL import Image
            s['image'] = Image.open(a.image)
        print(answer(m, tok, s, a.merge))
        return
    import gen
    f = open(a.out, 'w') if a.out else sys.stdout
    t0 = time.time()
    k = 0
    for rec, img in gen.records(a.split, a.seed, a.n, a.task, a.start):
        out = answer(m, tok, dict(prompt=rec['prompt'], image=img), a.merge)
        f.write(json.dumps(dict(id=rec['id'], output=out)) + '\n')
        f.flush()
        k += 1
    print(f'chat: {k} predictions in {time.time()-t0:.0f}s', file=sys.stderr)


if __name__ == '__main__':
    main()
