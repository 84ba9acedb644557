#!/usr/bin/python3
"""Where in the vision tower a scene fact first reads out: a linear probe per layer.

    scripts/ref/layer_probe.py --ckpt CKPT [--n 600] [--merge 4]

Session 16 found the tower writes how many shapes share a colour (ncolour
0.96-1.00) but not how many share a shape (nshape ~0.65, what answering "no
other" scores), and guessed that shape identity forms too late in the
6-layer tower to be compared across shapes.  This measures it: the tower
runs over --n val scenes; after each layer (and the 16x merger) its rows are
averaged over each output token's block, so every layer speaks per output
token; at the tokens holding exactly one shape a logistic-regression probe
per fact (colour, shape, ncolour, nshape) is fitted on 70% of the shapes and
scored on the rest.  A fact readable at layer L can be compared across
shapes by the attention of the layers after L; nshape readable nowhere means
no layer compares.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import bpe          # noqa: E402
import compact      # noqa: E402
import scene_code   # noqa: E402
import tower_code   # noqa: E402
from model import MiniCPMV   # noqa: E402


def pooled(vis, px, merge):
    """[(name, (n_out, width))]: the rows after each stage, averaged over each output token's block,
    and the tower's output rows."""
    out = []

    def tap(stage, x, gh, gw):
        level = 'm' if gh < px.shape[2] // vis.v.patch else 'p'     # after the merger: half the patch grid
        blk = 2 if level == 'm' else merge
        y = x.view(1, gh // blk, blk, gw // blk, blk, -1).mean((2, 4)).reshape(-1, x.shape[-1])
        out.append((f'{level}-{stage}' if stage in ('embed', 'merger') else f'{level}-layer{stage}', y))

    y, _ = vis(px, merge, tap)
    out.append(('output', y[0]))
    return out


def probe_acc(x, y, n_cls, steps=300, wd=1e-3):
    """Held-out accuracy of a logistic regression x -> y (70/30 split, standardized features)."""
    n = x.shape[0]
    cut = int(n * 0.7)
    mu, sd = x[:cut].mean(0), x[:cut].std(0) + 1e-6
    x = (x - mu) / sd
    lin = torch.nn.Linear(x.shape[1], n_cls)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=steps, line_search_fn='strong_wolfe')

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(lin(x[:cut]), y[:cut]) + wd * lin.weight.pow(2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    with torch.no_grad():
        return float((lin(x[cut:]).argmax(1) == y[cut:]).float().mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True)
    ap.add_argument('--n', type=int, default=600, help='val scenes')
    ap.add_argument('--merge', type=int, default=4, choices=(2, 4), help='4 = 16x, 2 = 4x')
    ap.add_argument('--first', type=int, default=3000, help='first val index')
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not os.path.exists(a.ckpt):
        sys.exit(f'layer_probe: {a.ckpt}: no such file')
    d = compact.load(a.ckpt)
    model = MiniCPMV.from_config(d['config'])
    model.load_state_dict(d['model'])
    model.eval()
    tok = bpe.default()
    feats, labels = {}, {k: [] for k in ('colour', 'shape', 'ncolour', 'nshape')}
    with torch.no_grad():
        for i in range(a.n):
            sq = tower_code.encode(tok, model.vc, 'val', a.first + i, a.merge)
            for ci, c in enumerate(sq['crops']):
                t = sq['scene_t'][ci]
                one, _ = scene_code.single_shape(t)
                if not one.any():
                    continue
                for name, y in pooled(model.vision, c[None], a.merge):
                    feats.setdefault(name, []).append(y[one])
                for g in ('colour', 'shape'):
                    labels[g].append(t[one][:, scene_code.G_IDX[g]].argmax(1))
                for k in ('ncolour', 'nshape'):
                    labels[k].append(sq['extra_t'][k][ci][one].argmax(1))
    ys = {k: torch.cat(v) for k, v in labels.items()}
    n = len(ys['shape'])
    base = {k: float((y == y[int(n * 0.7):].mode().values).float()[int(n * 0.7):].mean()) for k, y in ys.items()}
    print(f'layer_probe: {a.n} val scenes at {"16x" if a.merge == 4 else "4x"}, {n} single-shape tokens; '
          'held-out accuracy of a linear probe (majority class: '
          + ', '.join(f'{k} {v:.2f}' for k, v in base.items()) + ')', flush=True)
    print(f'{"stage":10s} ' + ' '.join(f'{k:>8s}' for k in ys), flush=True)
    for name, xs in feats.items():
        x = torch.cat(xs)
        accs = [probe_acc(x, y, int(y.max()) + 1) for y in ys.values()]
        print(f'{name:10s} ' + ' '.join(f'{v:8.3f}' for v in accs), flush=True)


if __name__ == '__main__':
    main()
