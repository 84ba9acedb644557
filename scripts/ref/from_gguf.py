#!/usr/bin/python3
"""A training checkpoint from exported GGUF files (Q8_0 dequantized), to train on from them.

    scripts/ref/from_gguf.py TEXT.gguf MMPROJ.gguf OUT.pt [--step N --sample N]

Like a compact checkpoint, it has no optimizer state: train.py resumes from
it with fresh Adam moments and a rate ramp, oracle_read.py and tower_code.py
start from it as from any checkpoint.  --step / --sample: where in the run
the files came from (the shipped files: step 1368, 20,800 samples).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compact   # noqa: E402
import export    # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('text')
    ap.add_argument('mmproj')
    ap.add_argument('out')
    ap.add_argument('--step', type=int, default=0)
    ap.add_argument('--sample', type=int, default=0)
    a = ap.parse_args()
    for f in (a.text, a.mmproj):
        if not os.path.exists(f):
            sys.exit(f'from_gguf: {f}: no such file')
    try:
        m = export.load(a.text, a.mmproj)
    except (ValueError, KeyError, OSError) as e:
        sys.exit(f'from_gguf: {a.text}, {a.mmproj}: not a proving-model pair ({e})')
    compact.save(dict(model=m.state_dict(), opt=None, config=m.config_dict(),
                      state=dict(step=a.step, sample=a.sample, seed=1, args={}, from_gguf=[a.text, a.mmproj])), a.out)
    print(f'from_gguf: wrote {a.out}')


if __name__ == '__main__':
    main()
