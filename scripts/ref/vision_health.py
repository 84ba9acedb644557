#!/usr/bin/python3
"""Does the vision tower still carry what is in the picture?

    scripts/ref/vision_health.py --ckpt CKPT [--n 600] [--reg 1e-2]

For val scenes, the output token whose cell holds a shape's centre (the token
the dense probe targets, probe.crop_cells) should tell that shape's colour.
A linear classifier (L-BFGS, L2 `--reg`, fitted on 2/3 of the shapes, scored
on the rest) is fitted on three inputs, at 16x and 4x:

  tower        the checkpoint's tower output at that token (layer-normalised)
  random       the same from a freshly initialised tower (seed 0)
  cell pixels  the mean RGB of that token's cell (what is there to find)

A tower well below `random` has thrown information away in training; the
proving model's step-2442 tower scored 0.28 / 0.26 against 0.80 / 0.95 for a
random one (examples/models/README.md), which is why it was re-initialised.

A second table asks the same of a token's column and row (every token of the
first crop of val snippets and scenes, `--positions`): the language model's
RoPE barely turned for an image column at base 1e6, so the tokens' content
was the only place it could learn reading order from.  At step 5976 the
trained tower told a column no better than a random one (4x: 0.43 vs 0.41 of
8 columns), which is why the run moved to RoPE base 200 (session 6).
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import compact   # noqa: E402
import probe   # noqa: E402
import synth   # noqa: E402
from model import MiniCPMV, image_to_crops   # noqa: E402


def collect(model, n, merge):
    """-> tower features, cell mean pixels, colour ids of the shapes of n val scenes."""
    cols = list(synth.COLOURS)
    X, P, Y = [], [], []
    cs = model.vc.patch * merge
    with torch.no_grad():
        for i in range(n):
            marks = []
            s = synth.sample('val', i, task='scene_caption', marks=marks)
            crop = image_to_crops(s['image'], model.vc, merge)[0][0]
            f, (nx, _) = model.vision(crop[None], merge)
            f = F.layer_norm(f[0], f.shape[-1:])
            for ti, what in probe.crop_cells(marks, s['image'].size, model.vc, merge)[0]:
                r, c = divmod(ti, nx)
                X.append(f[ti])
                P.append(crop[:, r * cs:(r + 1) * cs, c * cs:(c + 1) * cs].mean((1, 2)))
                Y.append(cols.index(what[1]))
    return torch.stack(X), torch.stack(P), torch.tensor(Y)


def collect_positions(model, n, merge, task):
    """-> tower features of every token of the first crop of n val samples of task, and
    each token's column and row.  The language model's RoPE barely turns for an image
    column (0.03 rad at base 1e6), so the tokens' content is where it can learn order."""
    X, C, R = [], [], []
    with torch.no_grad():
        for i in range(n):
            s = synth.sample('val', 2000 + i, task=task)
            crop = image_to_crops(s['image'], model.vc, merge)[0][0]
            f, (nx, ny) = model.vision(crop[None], merge)
            X.append(F.layer_norm(f[0], f.shape[-1:]))
            C += [t % nx for t in range(nx * ny)]
            R += [t // nx for t in range(nx * ny)]
    return torch.cat(X), torch.tensor(C), torch.tensor(R)


def held_out_accuracy(Z, Y, reg, n_class):
    n = len(Y) * 2 // 3
    W = torch.zeros(Z.shape[1], n_class, requires_grad=True)
    b = torch.zeros(n_class, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], max_iter=300)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(Z[:n] @ W + b, Y[:n]) + reg * (W * W).sum()
        loss.backward()
        return loss
    opt.step(closure)
    with torch.no_grad():
        return float(((Z[n:] @ W + b).argmax(1) == Y[n:]).float().mean()), len(Y) - n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True)
    ap.add_argument('--n', type=int, default=600, help='val scenes (1-5 shapes each)')
    ap.add_argument('--reg', type=float, default=1e-2)
    ap.add_argument('--positions', type=int, default=60,
                    help="val snippets and scenes for the token's column / row table (0: skip)")
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d = compact.load(a.ckpt)   # a compact checkpoint too
    trained = MiniCPMV.from_config(d['config'])
    trained.load_state_dict(d['model'])
    torch.manual_seed(0)
    fresh = MiniCPMV.from_config(d['config'])
    ncol = len(synth.COLOURS)
    print(f"colour of the shape at its token, held-out linear accuracy ({a.ckpt}, {a.n} val scenes)")
    print("mode  tower  random  cell-pixels  shapes")
    for merge, name in ((4, '16x'), (2, '4x')):
        X, P, Y = collect(trained.eval(), a.n, merge)
        Xr, _, _ = collect(fresh.eval(), a.n, merge)
        acc = [held_out_accuracy(Z, Y, a.reg, ncol) for Z in (X, Xr, P)]
        print(f"{name:4s}  {acc[0][0]:.2f}   {acc[1][0]:.2f}    {acc[2][0]:.2f}         {acc[0][1]}")
    if a.positions:
        print(f"\na token's column and row from its output, held-out linear accuracy "
              f"(first crop of {a.positions} val samples)")
        print("task           mode  column: tower  random (classes)  row: tower  random")
        for task in ('snippet_read', 'scene_caption'):
            for merge, name in ((4, '16x'), (2, '4x')):
                X, C, R = collect_positions(trained.eval(), a.positions, merge, task)
                Xr, _, _ = collect_positions(fresh.eval(), a.positions, merge, task)
                k = int(C.max()) + 1
                col = [held_out_accuracy(Z, C, a.reg, k)[0] for Z in (X, Xr)]
                row = [held_out_accuracy(Z, R, a.reg, int(R.max()) + 1)[0] for Z in (X, Xr)]
                print(f"{task:14s} {name:4s}  {col[0]:.2f}   {col[1]:.2f}  ({k})          "
                      f"{row[0]:.2f}   {row[1]:.2f}", flush=True)


if __name__ == '__main__':
    main()
