#!/usr/bin/env python3
"""The mean of several checkpoints' weights, as one checkpoint.

    average.py OUT.pt CKPT CKPT [CKPT...]

Legs that go on side by side from one checkpoint at a small rate wander
around the same plateau; their weight mean often scores above each of them
(Izmailov et al., "Averaging weights leads to wider optima", 2018).  The
output holds the mean of every floating-point tensor of the model (and of
the auxiliary heads train.py keeps beside it); everything else (config,
codes, the step) is the first checkpoint's.  It has no optimizer state, so
a run resumed from it starts Adam afresh and ramps the rate up again, as
from a compact file.  Checkpoints are read through compact.load, so compact
files mix with full ones.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compact  # noqa: E402


def mean_of(dicts, what):
    keys = list(dicts[0])
    for d in dicts[1:]:
        if list(d) != keys:
            sys.exit(f"average.py: the checkpoints' {what} differ in their tensors")
    out = {}
    for k in keys:
        v = dicts[0][k]
        # tensors every file holds alike (fixed codes) stay exact; the mean of three equal
        # floats need not be
        if torch.is_tensor(v) and v.is_floating_point() and not all(torch.equal(v, d[k]) for d in dicts):
            out[k] = sum(d[k].float() for d in dicts) / len(dicts)
        else:
            out[k] = v
    return type(dicts[0])(out)


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: average.py OUT.pt CKPT CKPT [CKPT...]")
    out, paths = argv[0], argv[1:]
    cks = []
    for p in paths:
        if not os.path.exists(p):
            sys.exit(f"average.py: {p}: no such file")
        cks.append(compact.load(p))
    # no optimizer state, marked as compact.py marks it (None), which train.py takes for a
    # fresh start of Adam's moments with the rate ramped up again
    opt = [k for k in cks[0] if k == 'opt' or k.endswith('_opt')]
    res = {k: None if k in opt else v for k, v in cks[0].items()}
    for k, v in cks[0].items():
        # the model and every head or code stored beside it as a dict of tensors
        if isinstance(v, dict) and v and k not in opt + ['state', 'config'] and all(
                torch.is_tensor(x) for x in v.values()):
            if not all(isinstance(c.get(k), dict) for c in cks):
                sys.exit(f"average.py: {k}: not in every checkpoint")
            res[k] = mean_of([c[k] for c in cks], k)
    res['state'] = dict(res['state'], average=[os.path.basename(p) for p in paths])
    compact.save(res, out)
    print(f"average.py: {out}: mean of {len(paths)} checkpoints")


if __name__ == "__main__":
    main(sys.argv[1:])
