#!/usr/bin/env python3
"""A training checkpoint small enough to commit, so a run outlives the machine.

    compact.py CKPT OUT.pt

A checkpoint of the proving run is ~435 MB: float32 weights plus Adam's two
moments.  The compact one keeps the weights and the auxiliary heads in
float16 (~72 MB) and drops every optimizer state.  train.py resumes from it
like from any checkpoint (copy it into the run directory): it starts Adam's
moments afresh and ramps the learning rate up again over --rewarm steps,
because fresh moments with the full rate would take one large sign-like step
on every weight.  export.py, chat.py and the other readers load it unchanged.
"""
import os
import sys

import torch


def half(sd):
    return {k: v.half() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in sd.items()}


def compact(d):
    out = {}
    for k, v in d.items():
        if k == 'opt' or k.endswith('_opt'):
            out[k] = None
        elif isinstance(v, dict) and v and all(torch.is_tensor(t) for t in v.values()):
            out[k] = half(v)          # the model and every auxiliary head
        else:
            out[k] = v                # state, config, modes
    return out


def main(argv):
    if len(argv) != 2:
        sys.exit('usage: compact.py CKPT OUT.pt')
    src, dst = argv
    try:
        d = torch.load(src, map_location='cpu')
    except (OSError, RuntimeError, EOFError) as e:
        sys.exit(f'compact: {src}: {str(e).splitlines()[0]}')
    if not isinstance(d, dict) or 'model' not in d or 'state' not in d:
        sys.exit(f'compact: {src}: not a training checkpoint')
    tmp = dst + '.tmp'
    torch.save(compact(d), tmp)
    os.replace(tmp, dst)
    print(f'compact: {dst} step {d["state"]["step"]} {os.path.getsize(dst) / 1e6:.1f} MB')


if __name__ == '__main__':
    main(sys.argv[1:])
