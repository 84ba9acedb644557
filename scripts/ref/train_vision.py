#!/usr/bin/python3
"""A tower-only stage: train the vision tower on the dense probe targets alone.

    scripts/ref/train_vision.py --run DIR [--minutes 30 | --samples N] [--lr 1e-3] [--sub 1.0]
                                [--dense N --mix scene_caption=1,scene_count=1]

The language model reads only what the tower's tokens carry, and in the
joint run the tower learned glyphs slowly: at step 5891 the probe head named
only 0.3-0.5 of a token's glyphs (glyph_recall.py), so no digit was read.
This stage stops the language model (no forward, no backward: the tower is
~60% of a joint step's FLOPs) and trains the tower, the probe head and the
glyph-position heads on the probe losses of text and scene images, at a
rate the joint run could not give the tower without the language model's
gradient wrecking it (session 4).  Scenes stay in the mix so the tower keeps
colours, shapes and sizes.

It takes the newest checkpoint of DIR (the trainer must be stopped), and
writes it back under the same step with the new tower and heads; the
language model, its optimizer state and the sample counter are untouched,
so train.sh resumes the joint run from it.  Samples come from the train
split at indices far above any the joint run draws (--first).  The stage is
recorded in the checkpoint's state ('vision_stages').
"""
import argparse
import os
import random
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import bpe       # noqa: E402
import chatfmt   # noqa: E402
import probe     # noqa: E402
import synth     # noqa: E402
from train import dense_batch, latest_ckpt, tower_feats   # noqa: E402

TASK_MIX = dict(snippet_read=3, receipt_read=2, screenshot_read=1, scene_caption=1.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--run', required=True, help='run directory (its newest ckpt-*.pt is read and rewritten)')
    ap.add_argument('--minutes', type=float, default=30)
    ap.add_argument('--samples', type=int, default=0,
                    help='stop after this many samples instead (0: --minutes decides); recipe.sh replays a stage so')
    ap.add_argument('--lr', type=float, default=1e-3, help="the tower's learning rate (heads: 5x)")
    ap.add_argument('--sub', type=float, default=1.0, help='weight of the glyph-position loss')
    ap.add_argument('--batch', type=int, default=12, help='samples per step')
    ap.add_argument('--p4x', type=float, default=0.5)
    ap.add_argument('--first', type=int, default=50_000_000, help='first train-split index drawn')
    ap.add_argument('--dense', type=int, default=0, metavar='N',
                    help="per step, N dense text crops (synth.dense_text) on the patch-level glyph head "
                         "(train.py --dense; the checkpoint's head if it has one)")
    ap.add_argument('--dense-weight', type=float, default=1.0)
    ap.add_argument('--mix', default=None, metavar='TASK=W,...',
                    help=f'task mix of the samples (default {",".join(f"{k}={v}" for k, v in TASK_MIX.items())}); '
                         'with --dense, scene tasks alone keep colours and shapes while the crops teach glyphs')
    ap.add_argument('--threads', type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ck = latest_ckpt(a.run)
    if ck is None:
        sys.exit(f'train_vision: no ckpt-*.pt in {a.run}')
    d, model, head, sub = probe.load_with_heads(ck, 'train_vision')
    if sub is None:
        sys.exit(f'train_vision: {ck} has no glyph-position heads (train with --probe-sub first)')
    mix = TASK_MIX
    if a.mix:
        try:
            mix = {k: float(v) for k, v in (kv.split('=') for kv in a.mix.split(','))}
        except ValueError:
            sys.exit(f'train_vision: --mix: want TASK=WEIGHT,..., got {a.mix!r}')
        bad = [k for k in mix if k not in synth.TASKS + synth.TRAIN_TASKS or k == 'text']
        if bad:
            sys.exit(f'train_vision: --mix: not an image task: {", ".join(bad)}')
    dense = None
    heads = list(head.parameters()) + list(sub.parameters())
    if a.dense > 0:
        dense = probe.new_patch_head(model.vc.width)
        if 'dense' in d:
            dense.load_state_dict(d['dense'])
        heads += list(dense.parameters())
    model.train()
    for p in model.text.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW([dict(params=list(model.vision.parameters()), lr=a.lr),
                             dict(params=heads, lr=5 * a.lr, weight_decay=0.0)], betas=(0.9, 0.95))
    tok = bpe.default()
    stages = d['state'].setdefault('vision_stages', [])
    first = a.first + sum(s['samples'] for s in stages)
    log = open(os.path.join(a.run, 'train.log'), 'a')

    def say(msg):
        line = time.strftime('%Y-%m-%d %H:%M:%S ') + 'vision-stage ' + msg
        print(line, flush=True)
        log.write(line + '\n')
        log.flush()
    dfirst = a.first + sum(s.get('dense_crops', 0) for s in stages)
    say(f'from {ck}: lr {a.lr}, sub weight {a.sub}, {a.minutes} min, samples from index {first}'
        + (f', {a.dense} dense crops a step from index {dfirst}' if dense else ''))
    tl = sorted(mix)
    t_end, t0 = time.time() + a.minutes * 60, time.time()
    n = steps = 0
    acc = dict(probe=0.0, sub=0.0, k=0)
    warm = 30
    while (n < a.samples) if a.samples else (time.time() < t_end):
        seqs = []
        for i in range(first + n, first + n + a.batch):
            task = random.Random(f"vtask:{i}").choices(tl, [mix[t] for t in tl])[0]
            marks = []
            s = synth.sample('train', i, task=task, marks=marks)
            mg = 2 if random.Random(f"vmode:{i}").random() < a.p4x else 4
            sq = chatfmt.encode_sample(tok, s, model.vc, mg)
            shapes = [c.shape for c in sq['crops']]
            sq['probe'] = probe.targets(marks, s['image'].size, model.vc, mg, shapes, synth.mark_labels,
                                        len(synth.MARK_LABELS))
            sq['probe_sub'] = probe.sub_targets(marks, s['image'].size, model.vc, mg, shapes)
            seqs.append(sq)
        n += a.batch
        feats = tower_feats(model, seqs)
        lp = probe.loss(head, feats, seqs)
        ls = probe.sub_loss(sub, feats, seqs)
        loss = lp + a.sub * ls
        if dense is not None:
            px, tg = dense_batch(model.vc, 'train', range(dfirst + steps * a.dense, dfirst + (steps + 1) * a.dense))
            ld = probe.patch_loss(dense, model.vision.patch_rows(px), tg)
            loss = loss + a.dense_weight * ld
            acc['dense'] = acc.get('dense', 0.0) + float(ld)
        for g, base in zip(opt.param_groups, (a.lr, 5 * a.lr)):
            g['lr'] = base * min(1.0, (steps + 1) / warm)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.vision.parameters()), 1.0)
        if not torch.isfinite(loss):
            say(f'step {steps}: non-finite loss, stopping without writing')
            sys.exit(1)
        opt.step()
        steps += 1
        acc['probe'] += float(lp)
        acc['sub'] += float(ls)
        acc['k'] += 1
        if steps % 10 == 0:
            dt = time.time() - t0
            dl = f' dense {acc["dense"] / acc["k"]:.3f}' if dense is not None else ''
            say(f'step {steps} probe {acc["probe"] / acc["k"]:.3f} sub {acc["sub"] / acc["k"]:.3f}{dl} '
                f'{n / dt:.2f} samples/s')
            acc = dict(probe=0.0, sub=0.0, k=0)
    stages.append(dict(samples=n, steps=steps, lr=a.lr, sub=a.sub, minutes=a.minutes,
                       at_step=d['state']['step'], dense_crops=steps * a.dense if dense else 0,
                       mix=mix))
    if dense is not None:
        d['dense'] = dense.state_dict()
    d['model'] = model.state_dict()
    d['probe'] = head.state_dict()
    d['probe_sub'] = sub.state_dict()
    tmp = ck + '.tmp'
    torch.save(d, tmp)
    os.replace(tmp, ck)
    say(f'wrote {ck}: {steps} steps, {n} samples in {(time.time() - t0) / 60:.1f} min')


if __name__ == '__main__':
    main()
