#!/usr/bin/python3
"""Does the language model look at the image?

    scripts/ref/image_use.py --ckpt CKPT [--n 8] [--tasks receipt_read,...]

For N val samples of each image task, at 16x and 4x, the answer's
cross-entropy with the sample's own image and with another image (the next
sample's, or a grey picture of the same size when the crop layout differs).
Equal numbers mean the answers are guessed from the prompt alone: at step 4173
the proving model's receipts scored 1.44 both ways, its scene captions 0.92
against 1.18 (examples/models/README.md, session 5).  The digit columns
are the same over the answer's digit tokens only, which no prior can guess:
at step 5733 small-print snippets gained +0.39 with their own image over the
whole answer (layout: how many lines, how long) but +0.03 on digits.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import bpe       # noqa: E402
import chatfmt   # noqa: E402
import compact   # noqa: E402
import synth     # noqa: E402
from model import MiniCPMV   # noqa: E402
from train import answer_logits, build_batch   # noqa: E402


def answer_ce(model, tok, sq, feats=None):
    """(mean answer CE, CE summed over the answer's digit tokens, their count).
    Digits are the part of a receipt no prior can guess: a gap there is
    reading, where a gap over the whole answer can also be layout (how many
    lines, how long).  feats: image rows instead of the tower's (build_batch)."""
    b = build_batch(model, [sq], feats=feats)
    with torch.no_grad():
        logits, tgt = answer_logits(model, b, model.text(b['emb'], b['pos'], mask=b['mask']))
        ce = F.cross_entropy(logits, tgt, reduction='none')
    digit = torch.tensor([tok.decode([int(t)]).strip().isdigit() for t in tgt])
    return ce.mean().item(), ce[digit].sum().item(), int(digit.sum())


def val_samples(task, n, marks=False):
    """n val samples of task; snippet_large / snippet_small are the large- and
    small-print halves of snippet_read.  marks: each sample also carries its
    synth marks under 'marks'."""
    def one(i, t):
        m = [] if marks else None
        s = synth.sample('val', i, task=t, marks=m)
        return dict(s, marks=m) if marks else s
    if not task.startswith('snippet_') or task == 'snippet_read':
        return [one(1000 + i, task) for i in range(n)]
    want, out, i = task == 'snippet_large', [], 1000
    while len(out) < n:
        if synth.snippet_is_large('val', i) == want:
            out.append(one(i, 'snippet_read'))
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True)
    ap.add_argument('--n', type=int, default=8, help='val samples per task and mode')
    ap.add_argument('--tasks', default=None,
                    help='comma-separated; snippet_large/snippet_small split snippet_read (default: all)')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tasks = a.tasks.split(',') if a.tasks else \
        [t for t in synth.TASKS if t != 'text'] + ['snippet_large', 'snippet_small']
    d = compact.load(a.ckpt)   # a compact checkpoint too
    model = MiniCPMV.from_config(d['config'])
    model.load_state_dict(d['model'])
    model.eval()
    tok = bpe.default()
    print(f'answer cross-entropy, own image vs another ({a.ckpt}, {a.n} val samples per row)')
    print(f"{'task':16s} mode  own    other  other-own  (digit tokens: own  other  other-own)")
    for task in tasks:
        ss = val_samples(task, a.n)
        for mg, mode in ((4, '16x'), (2, '4x')):
            own = other = 0.0
            dig = [0.0, 0.0, 0]
            for i, s in enumerate(ss):
                sq = chatfmt.encode_sample(tok, s, model.vc, mg)
                alt = chatfmt.encode_sample(tok, dict(s, image=ss[(i + 1) % a.n]['image']), model.vc, mg)
                if len(alt['ids']) != len(sq['ids']) or \
                        [c.shape for c in alt['crops']] != [c.shape for c in sq['crops']]:
                    grey = Image.new('RGB', s['image'].size, (128, 128, 128))
                    alt = chatfmt.encode_sample(tok, dict(s, image=grey), model.vc, mg)
                (o, od, nd), (t, td, _) = answer_ce(model, tok, sq), answer_ce(model, tok, alt)
                own, other = own + o / a.n, other + t / a.n
                dig = [dig[0] + od, dig[1] + td, dig[2] + nd]
            d = (f'  {dig[0] / dig[2]:.3f}  {dig[1] / dig[2]:.3f}  {(dig[1] - dig[0]) / dig[2]:+.3f}'
                 if dig[2] else '')
            print(f'{task:16s} {mode:4s}  {own:.3f}  {other:.3f}  {other - own:+.3f}{d}', flush=True)


if __name__ == '__main__':
    main()
