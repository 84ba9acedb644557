#!/usr/bin/python3
"""Can the vision tower say which glyphs are in a token?

    scripts/ref/glyph_recall.py --ckpt CKPT [--n 6] [--tasks snippet_small,snippet_large,receipt_read]

The language model can read only what the tower's tokens carry.  For val
images with text, every output token whose cell holds glyph centres
(probe.crop_cells, the dense probe's targets) asks the checkpoint's probe head
(trained beside the model, on a stream of fresh training samples) for its k
most likely glyphs, k the number of glyphs really there: recall@k over all
such tokens, and among the digits alone (chance 0.1).  At step 5733 of the
proving run it was 0.21-0.48 (digits 0.32-0.52): a tower that cannot name
most glyphs, the reason no digit was read (examples/models/README.md,
session 6).  Needs a checkpoint trained with --probe.  A checkpoint trained
with --dense also gets the patch-level head's recall on 48 val dense crops.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import bpe       # noqa: E402
import chatfmt   # noqa: E402
import probe     # noqa: E402
import synth     # noqa: E402
from image_use import val_samples   # noqa: E402

DIGITS = [synth.MARK_LABELS.index(c) for c in '0123456789']   # their label ids


def recall(model, head, tok, samples, merge):
    """-> (glyph hits, glyphs, digit hits, digits) over the samples' tokens."""
    hit = tot = dhit = dtot = 0
    for s in samples:
        marks = s['marks']
        sq = chatfmt.encode_sample(tok, s, model.vc, merge)
        tg = probe.targets(marks, s['image'].size, model.vc, merge, [c.shape for c in sq['crops']],
                           synth.mark_labels, len(synth.MARK_LABELS))
        for c, t in zip(sq['crops'], tg):
            with torch.no_grad():
                f, _ = model.vision(c[None], merge)
                lg = head(F.layer_norm(f[0], f[0].shape[-1:]))[:, :probe.N_GLYPH]
            t = t[:, :probe.N_GLYPH]
            for r in t.sum(1).nonzero().flatten().tolist():
                true = set(t[r].nonzero().flatten().tolist())
                hit += len(true & set(lg[r].topk(len(true)).indices.tolist()))
                tot += len(true)
                dtrue = true & set(DIGITS)
                if dtrue:
                    top = lg[r, DIGITS].topk(len(dtrue)).indices.tolist()
                    dhit += len(dtrue & {DIGITS[j] for j in top})
                    dtot += len(dtrue)
    return hit, tot, dhit, dtot


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True)
    ap.add_argument('--n', type=int, default=6, help='val samples per task')
    ap.add_argument('--tasks', default='snippet_small,snippet_large,receipt_read,screenshot_read')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d, model, head, _ = probe.load_with_heads(a.ckpt, 'glyph_recall')
    model.eval()
    tok = bpe.default()
    print(f'glyph recall@k of the probe head ({a.ckpt}, {a.n} val samples per row)')
    print(f"{'task':16s} mode  glyphs (n)        digits among digits (n)")
    for task in a.tasks.split(','):
        samples = val_samples(task, a.n, marks=True)
        for mg, mode in ((4, '16x'), (2, '4x')):
            hit, tot, dhit, dtot = recall(model, head, tok, samples, mg)
            print(f'{task:16s} {mode:4s}  {hit / max(tot, 1):.3f} ({tot:5d})    '
                  f'{dhit / max(dtot, 1):.3f} ({dtot})', flush=True)
    if 'dense' in d:
        # the patch-level head of train.py --dense, on val dense crops: what the tower's
        # unmerged rows name, before the projector packs them into tokens
        from train import dense_batch
        dense = probe.new_patch_head(model.vc.width)
        dense.load_state_dict(d['dense'])
        hit, tot = probe.patch_recall_over(dense, model.vision.patch_rows, *dense_batch(model.vc, 'val', range(48)))
        print(f"{'dense crops':16s} patch {hit / max(tot, 1):.3f} ({tot:5d})    (patch-level head, 48 val crops)")


if __name__ == '__main__':
    main()
