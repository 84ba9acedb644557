#!/usr/bin/python3
"""How fast does a tower learn to name the glyphs in each patch?

    scripts/ref/glyph_rate.py [--ckpt CKPT [--freeze]] [--data dense|snippet] [--lr 1e-3] [--minutes 10]
    scripts/ref/glyph_rate.py --mlp            # no tower: an MLP on each patch's 3x3 neighbourhood
    scripts/ref/glyph_rate.py --zoom 2 ...     # dense crops at twice the print size

Trains a linear head on the tower's unmerged patch rows (model.VisionModel.patch_rows)
to name the glyphs whose centre lies in each 14-px patch (probe.patch_targets), on
dense text crops (synth.dense_text) or snippets, and prints the head's recall@k
(probe.patch_recall) on 48 val crops as it goes.  A fresh tower (no --ckpt), a run's
tower fine-tuned, or the run's tower frozen (--freeze: what its rows already carry)
can be compared by crops seen.  --zoom Z cuts a random square of 224/Z pixels out of
each dense crop and enlarges it to 224 (train and val alike): how the rate depends on
the print's size in patches, which a slice resolution sets.

Session 7 (examples/models/README.md): a fresh tower 0.14 after 3,840 crops, the
step-7404 tower 0.30 frozen and 0.51 after 5,460 dense crops at 1e-3, an MLP on raw
pixels 0.24 after 17,920.  Session 22, from the shipped tower at 7,040 crops: zoom 1
and 2 alike (0.28 / 0.30 at 1e-3), 3e-3 0.36, --batch 4 0.39 at 1e-3 and 0.46 at
3e-3 (--batch 2 0.44), 1e-2 no better than 1e-3: optimiser steps set the rate, not
print size.
"""
import argparse
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import compact   # noqa: E402
import probe     # noqa: E402
import synth     # noqa: E402
from model import VisionConfig, VisionModel, image_to_crops, tower_from_dict   # noqa: E402
from train import dense_batch, dense_crop   # noqa: E402


def snippet_crop(vc, split, index):
    """A snippet_read image (224x224) as dense_crop returns a dense one."""
    marks = []
    s = synth.sample(split, index, 'snippet_read', marks=marks)
    return image_to_crops(s['image'], vc, 2)[0][0], probe.patch_targets(marks, 224, vc.patch)


def zoomed_dense_crop(zoom):
    """A crop function like train.dense_crop whose crops show a random square of 224/zoom
    pixels of a dense crop enlarged to 224: print zoom times as large in patches."""
    def crop(vc, split, index):
        img, marks = synth.dense_text(split, index)
        side = int(round(img.width / zoom))
        rng = random.Random(f'glyph-rate-zoom:{split}:{index}')
        x0, y0 = rng.randint(0, img.width - side), rng.randint(0, img.height - side)
        big = img.crop((x0, y0, x0 + side, y0 + side)).resize((img.width, img.height), Image.BICUBIC)
        k = img.width / side
        marks = [((x - x0) * k, (y - y0) * k, ch) for x, y, ch in marks
                 if x0 <= x < x0 + side and y0 <= y < y0 + side]
        return image_to_crops(big, vc, 2)[0][0], probe.patch_targets(marks, big.width, vc.patch)
    return crop


def neighbourhoods(px, patch):
    """(B, 3, 224, 224) -> (B, n_patch, 9 * patch^2): each patch's 3x3 block of patches, grey."""
    g = px.mean(1, keepdim=True)
    g = F.pad(g, (patch,) * 4, value=1.0)              # paper white beyond the edge
    return F.unfold(g, 3 * patch, stride=patch).transpose(1, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', help="start from this training checkpoint's tower (default: a fresh one)")
    ap.add_argument('--freeze', action='store_true', help='train the head only')
    ap.add_argument('--mlp', action='store_true', help='no tower: a 2-layer MLP on raw patch neighbourhoods')
    ap.add_argument('--data', choices=('dense', 'snippet'), default='dense')
    ap.add_argument('--zoom', type=float, default=1.0, help='dense crops enlarged this much (default 1)')
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--batch', type=int, default=16)
    ap.add_argument('--minutes', type=float, default=10)
    ap.add_argument('--every', type=int, default=40, help='steps between recall lines')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--bf16', action='store_true',
                    help="the tower's matmuls under CPU bf16 autocast (weights and head stay float32)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    vc = VisionConfig()
    if a.zoom < 1 or (a.zoom != 1 and a.data != 'dense'):
        sys.exit('glyph_rate: --zoom takes a factor >= 1, with --data dense')
    crop = snippet_crop if a.data == 'snippet' else dense_crop if a.zoom == 1 else zoomed_dense_crop(a.zoom)
    if a.mlp:
        net = torch.nn.Sequential(torch.nn.Linear(9 * vc.patch ** 2, 512), torch.nn.GELU(),
                                  torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.Linear(512, probe.N_GLYPH))
        rows_of, head, params = (lambda px: neighbourhoods(px, vc.patch)), net, list(net.parameters())
    else:
        if a.ckpt:
            if not os.path.exists(a.ckpt):
                sys.exit(f'glyph_rate: {a.ckpt}: no such file')
            # the checkpoint's own shape (the shipped tower has a seventh, grown layer)
            vm = tower_from_dict(compact.load(a.ckpt))
            vc = vm.v
        else:
            vm = VisionModel(vc, 256)
        head = probe.new_patch_head(vc.width)
        if a.freeze:
            vm.requires_grad_(False)
        def rows_of(px):
            return vm.patch_rows(px, a.bf16)
        params = list(head.parameters()) + ([] if a.freeze else list(vm.parameters()))
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    val = dense_batch(vc, 'val', range(48), crop)

    def recall():
        hit, tot = probe.patch_recall_over(head, rows_of, *val)
        return hit / max(tot, 1)

    what = 'mlp' if a.mlp else f"tower {a.ckpt or 'fresh'}{' frozen' if a.freeze else ''}"
    what += f', zoom {a.zoom:g}' if a.zoom != 1 else ''
    what += ', bf16' if a.bf16 else ''
    print(f'{what}, {a.data} crops, lr {a.lr}: recall {recall():.3f} at 0 crops', flush=True)
    t0, step = time.time(), 0
    while time.time() - t0 < a.minutes * 60:
        # train-split indices far above any a training run draws
        first = 90_000_000 + step * a.batch
        px, tg = dense_batch(vc, 'train', range(first, first + a.batch), crop)
        for g in opt.param_groups:
            g['lr'] = a.lr * min(1.0, (step + 1) / 30)
        loss = probe.patch_loss(head, rows_of(px), tg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % a.every == 0:
            print(f'{what}: recall {recall():.3f} at {step * a.batch} crops '
                  f'({time.time() - t0:.0f} s, loss {float(loss):.3f})', flush=True)
    print(f'{what}: recall {recall():.3f} at {step * a.batch} crops (end)', flush=True)


if __name__ == '__main__':
    main()
