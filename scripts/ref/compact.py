#!/usr/bin/env python3
"""A training checkpoint small enough to commit, so a run outlives the machine.

    compact.py CKPT OUT.pt
    compact.py --tower-only CKPT OUT.pt     # the vision tower alone, for graft.py --tower

A checkpoint of the proving run is ~435 MB: float32 weights plus Adam's two
moments.  The compact one drops every optimizer state and stores each matrix
of the model and the auxiliary heads as int8 with one float16 scale per row
(absmax / 127, as Q8_0 does per 32 values; the shipped files are Q8_0 too),
vectors as float16: ~37 MB, under the repository's 64 MiB limit for a file.
load() expands it back to float32; train.py and export.py read checkpoints
through it, so a compact file copied into a run directory resumes like any
other: train.py starts Adam's moments afresh and ramps the learning rate up
again over --rewarm steps, because fresh moments with the full rate would
take one large sign-like step on every weight.
"""
import os
import sys

import torch


def pack(t):
    if not (torch.is_tensor(t) and t.is_floating_point()):
        return t
    if t.dim() < 2:
        return t.half()
    rows = t.float().reshape(t.shape[0], -1)
    s = rows.abs().amax(1, keepdim=True) / 127
    q = torch.round(rows / s.clamp_min(1e-30)).to(torch.int8)
    return dict(q8=q, scale=s.half(), shape=tuple(t.shape))


def unpack(v):
    if isinstance(v, dict) and 'q8' in v:
        return (v['q8'].float() * v['scale'].float()).reshape(v['shape'])
    return v.float() if torch.is_tensor(v) and v.is_floating_point() else v


def compact(d):
    out = dict(compact=[])                                   # the keys packed
    for k, v in d.items():
        if k == 'opt' or k.endswith('_opt'):
            out[k] = None
        elif isinstance(v, dict) and v and all(torch.is_tensor(t) for t in v.values()):
            out[k] = {n: pack(t) for n, t in v.items()}     # the model and every auxiliary head
            out['compact'].append(k)
        else:
            out[k] = v                                       # state, config, modes
    return out


def load(path):
    """torch.load of a training checkpoint, compact or not, with float32 weights."""
    d = torch.load(path, map_location='cpu')
    for k in d.pop('compact', []) if isinstance(d, dict) else []:
        d[k] = {n: unpack(t) for n, t in d[k].items()}
    return d


def save(d, path):
    """torch.save through a temporary file, so a stopped job never leaves half a checkpoint."""
    tmp = path + '.tmp'
    torch.save(d, tmp)
    os.replace(tmp, path)


def main(argv):
    tower_only = argv[:1] == ['--tower-only']
    argv = argv[1:] if tower_only else argv
    if len(argv) != 2:
        sys.exit('usage: compact.py [--tower-only] CKPT OUT.pt')
    src, dst = argv
    try:
        d = torch.load(src, map_location='cpu')
    except (OSError, RuntimeError, EOFError) as e:
        sys.exit(f'compact: {src}: {str(e).splitlines()[0]}')
    if not isinstance(d, dict) or 'model' not in d or 'state' not in d:
        sys.exit(f'compact: {src}: not a training checkpoint')
    if tower_only:
        # a tower stage (tower_code.py) leaves the language model as it found it: a sixth of
        # the bytes carry what it learnt, and graft.py --tower puts it back on a language model
        d = dict(d, model={k: v for k, v in d['model'].items() if not k.startswith('text.')})
    tmp = dst + '.tmp'
    torch.save(compact(d), tmp)
    os.replace(tmp, dst)
    print(f'compact: {dst} step {d["state"]["step"]} {os.path.getsize(dst) / 1e6:.1f} MB')


if __name__ == '__main__':
    main(sys.argv[1:])
