#!/usr/bin/python3
"""Routing statistics of the proving model on a synthetic split (teacher forced:
prompt + reference answer), for the model card.

    routing.py (--model TEXT.gguf --mmproj MMPROJ.gguf | --ckpt C.pt) --seed N --n N [--task all] [--json]

Per layer: share of routed slots of the least and most loaded expert, the
normalised entropy of the load (1 = uniform), and "stale-gate recall": the
share of layer L+1's top-k recovered by applying layer L+1's router (after
its own post-attention RMSNorm) to the hidden state entering layer L, i.e.
one layer of lookahead as LES would predict it.
"""
import argparse
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import chatfmt   # noqa: E402
from chat import load_any   # noqa: E402
from model import rms_norm   # noqa: E402


@torch.no_grad()
def collect(m, tok, recs, merge=None):
    c = m.tc
    L = c.n_layer
    load = torch.zeros(L, c.n_expert)
    hit = torch.zeros(L)
    tot = torch.zeros(L)
    for rec, img in recs:
        sq = chatfmt.encode_sample(tok, dict(prompt=rec['prompt'], answer=rec['answer'], image=img), m.vc, merge)
        ids = torch.tensor(sq['ids'])
        e = m.text.embed[ids.clamp_min(0)]
        parts, last = [], 0
        for start, ci in sq['img_spans']:
            f, _ = m.vision(sq['crops'][ci][None], sq['merge'])
            parts += [e[last:start], f[0]]
            last = start + f.shape[1]
        parts.append(e[last:])
        e = torch.cat(parts, 0)[None]
        stats, hidden = [], []
        m.text(e, sq['pos'][None], stats=stats, hidden_out=hidden)
        for il in range(L):
            ti = stats[il]['topi']
            load[il] += torch.bincount(ti.reshape(-1), minlength=c.n_expert).float()
            if il + 1 < L:
                nb = m.text.blocks[il + 1]
                x = rms_norm(hidden[il][0], nb.post_norm, c.eps)
                pred = (x @ nb.moe.router.t()).topk(c.n_expert_used, -1).indices
                actual = stats[il + 1]['topi']
                same = (pred[:, :, None] == actual[:, None, :]).any(-1).float().sum()
                hit[il + 1] += same
                tot[il + 1] += actual.numel()
    rows = []
    for il in range(L):
        p = load[il] / load[il].sum()
        ent = float(-(p[p > 0] * p[p > 0].log()).sum() / math.log(c.n_expert))
        rows.append(dict(layer=il, min_share=float(p.min()), max_share=float(p.max()), entropy=ent,
                         stale_recall=(float(hit[il] / tot[il]) if tot[il] > 0 else None)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model')
    ap.add_argument('--mmproj')
    ap.add_argument('--ckpt')
    ap.add_argument('--split')
    ap.add_argument('--seed', type=int)
    ap.add_argument('--n', type=int, default=10)
    ap.add_argument('--task', default='all')
    ap.add_argument('--merge', type=int, default=None)
    ap.add_argument('--json', action='store_true')
    a = ap.parse_args()
    torch.set_num_threads(1)
    m, tok = load_any(a)
    import gen
    rows = collect(m, tok, gen.records(a.split, a.seed, a.n, a.task), a.merge)
    if a.json:
        print(json.dumps(rows))
        return
    print('| layer | type | min expert share | max expert share | load entropy | stale-gate recall (L-1 -> L) |')
    print('|---|---|---|---|---|---|')
    for r in rows:
        typ = 'DeltaNet' if m.tc.is_recurrent(r['layer']) else 'attention'
        sr = '' if r['stale_recall'] is None else f"{100*r['stale_recall']:.1f}%"
        print(f"| {r['layer']} | {typ} | {100*r['min_share']:.2f}% | {100*r['max_share']:.2f}% | {r['entropy']:.3f} | {sr} |")


if __name__ == '__main__':
    main()
