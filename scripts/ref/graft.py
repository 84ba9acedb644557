#!/usr/bin/python3
"""A checkpoint with one checkpoint's language model and another's vision tower.

    scripts/ref/graft.py --text LM.pt --tower TOWER.pt --out OUT.pt [--scale S]

The language model (its weights and config, RoPE base included) and its
codes (scene code and extra, glyph code) come from --text, the tower from --tower.  --scale multiplies the
tower's last layer (mm_down), so a tower taught the code at one scale feeds a
language model taught it at another (tower_code.py and oracle_read.py --feats
words --scale); the code is linear in it, so nothing else changes.
The tower's dense glyph head and its tower_code.py / tower_distill.py state come with it.
The tower may have more layers than --text's (tower_code.py --grow): the
vision config then comes from --tower; any other difference is refused.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compact   # noqa: E402
from train import CODE_KEYS   # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--text', required=True, metavar='CKPT')
    ap.add_argument('--tower', required=True, metavar='CKPT')
    ap.add_argument('--out', required=True, metavar='FILE')
    ap.add_argument('--scale', type=float, default=1.0)
    a = ap.parse_args()
    for f in (a.text, a.tower):
        if not os.path.exists(f):
            sys.exit(f'graft: {f}: no such file')
    lm, tw = compact.load(a.text), compact.load(a.tower)
    # the tower may have grown (tower_code.py --grow): its layer count may differ, nothing else
    lv, tv = dict(lm['config']['vision']), dict(tw['config']['vision'])
    lv.pop('n_layer'), tv.pop('n_layer')
    if lv != tv or lm['config']['text']['hidden'] != tw['config']['text']['hidden']:
        sys.exit(f'graft: {a.text} and {a.tower} have different shapes')
    m = {k: v for k, v in lm['model'].items() if k.startswith('text.')}
    m.update({k: v for k, v in tw['model'].items() if not k.startswith('text.')})
    for k in ('vision.mm_down.weight', 'vision.mm_down.bias'):
        m[k] = m[k] * a.scale
    config = dict(lm['config'], vision=tw['config']['vision'])
    d = dict(model=m, opt=None, config=config,
             state=dict(lm['state'], graft=dict(text=a.text, tower=a.tower, scale=a.scale)))
    d.update({k: lm[k] for k in CODE_KEYS if k in lm})
    # what belongs to the tower goes with it: its glyph head and where its stages stopped
    # (tower_code.py and tower_distill.py go on with the samples and crops after them)
    if 'dense_head' in tw:
        d['dense_head'] = tw['dense_head']
    for k in ('tower_code', 'tower_distill'):
        if k in tw['state']:
            d['state'][k] = tw['state'][k]
    compact.save(d, a.out)
    print(f'graft: wrote {a.out}')


if __name__ == '__main__':
    main()
