#!/usr/bin/python3
"""Greedy answers of a checkpoint's language model reading a fixed code instead of its tower.

    code_eval.py --ckpt C --split test --n 100 --task scene_caption [--merge 4|2]
                 [--feats tower|code] [--extra] -o PRED.jsonl
    then: scripts/eval.py --split test --n 100 --task scene_caption PRED.jsonl

--feats code puts scene_code's exact rows (the checkpoint's 'scene_code';
with --extra also its 'scene_extra' rows) where the tower's rows go: what
the language model would answer from a perfect tower, so a miss there is the
language model's.  --feats tower is chat.py's answer, for the same table.
Reading tasks (receipt_*, screenshot_read, word_read, ...) read the
checkpoint's glyph code instead ('glyph_code', placed as it was built: cell
grid or slots; an overview with tiles gets zero rows, as oracle_read.py
trains it): how far the language model reads from perfect glyph rows, in the
goals' own measures (scripts/eval.py: total exact match, CER).
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

import bpe         # noqa: E402
import compact     # noqa: E402
import gen         # noqa: E402
import glyph_code  # noqa: E402
import oracle_read  # noqa: E402
import scene_code  # noqa: E402
import synth       # noqa: E402
from chat import answer   # noqa: E402
from model import MiniCPMV   # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True)
    gen.add_set_args(ap)
    ap.add_argument('--merge', type=int, choices=(2, 4), default=4, help='4: 16x, 2: 4x')
    ap.add_argument('--feats', choices=('tower', 'code'), default='code')
    ap.add_argument('--extra', action='store_true', help="add the checkpoint's 'scene_extra' rows")
    ap.add_argument('-o', '--out', required=True)
    ap.add_argument('--max-new', type=int, default=320,
                    help='tokens generated at most: a model answering one character per token (oracle_read.py '
                         '--spell) needs one per character, and the longest answers run to ~280')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--upscale', type=float, default=1.0,
                    help='plan the slices as for the picture scaled by this (mcv-run --upscale)')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if not a.task or a.task == 'text':
        sys.exit('code_eval: give --task: a scene or reading task')
    if not os.path.exists(a.ckpt):
        sys.exit(f'code_eval: {a.ckpt}: no such file')
    d = compact.load(a.ckpt)
    scenes = a.task.startswith('scene_')
    if not scenes and a.extra:
        sys.exit('code_eval: --extra is for scene tasks')
    for key in (('scene_code',) + (('scene_extra',) if a.extra else ())) if scenes else ('glyph_code',):
        if a.feats == 'code' and key not in d:
            sys.exit(f'code_eval: {a.ckpt} has no {key}')
    m = MiniCPMV.from_config(d['config'])
    m.load_state_dict(d['model'])
    m.eval()
    tok = bpe.default()
    glyphs = oracle_read.GlyphCode(*glyph_code.stored(d)) if a.feats == 'code' and not scenes else None
    t0, k = time.time(), 0
    with open(a.out + '.tmp', 'w') as f:
        for rec, _ in gen.records(a.split, a.seed, a.n, a.task, a.start):
            _, _, task, index = synth.parse_id(rec['id'])
            marks = []
            s = synth.sample(a.split, index, task=task, seed=a.seed, marks=marks)
            feats = None
            if a.feats == 'code':
                sq = oracle_read.encode(tok, m.vc, dict(s, marks=marks), a.merge)
            if glyphs is not None:
                feats = {ci: v for (_, ci), v in oracle_read.oracle_feats(glyphs, m.vc, [sq]).items()}
            elif a.feats == 'code':
                feats = {ci: scene_code.rows(t, d['scene_code'])
                         + (scene_code.pick(sq['extra_t'], x['kind'], ci) @ x['table'] if (x := d.get('scene_extra')) and a.extra
                            else 0)
                         for ci, t in enumerate(sq['scene_t'])}
            out = answer(m, tok, dict(prompt=s['prompt'], image=s['image'], scale=a.upscale), a.merge, a.max_new,
                         feats)
            f.write(json.dumps(dict(id=rec['id'], output=out)) + '\n')
            k += 1
    os.replace(a.out + '.tmp', a.out)
    print(f'code_eval: {k} predictions in {time.time() - t0:.0f} s', file=sys.stderr)


if __name__ == '__main__':
    main()
