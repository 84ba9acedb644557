#!/usr/bin/python3
"""Teach one vision tower two teachers' rows: one tower's on scenes at 16x, another's on text at 4x.

    scripts/ref/tower_distill.py --ckpt CKPT --scenes TOWER.pt --text TOWER.pt --save OUT [--steps N]

Session 30 found one 192-wide tower trading the scene code against the glyph
code when it learnt both at both merges.  The shipped model is used with
scenes at 16x and reading at 4x (mcv-eval's defaults), so this asks less:
scene images only at 16x, where the rows are pulled (squared error, every
token of every crop) onto the rows the --scenes tower writes (a tower the
language model already reads), and text images only at 4x, pulled onto the
rows the --text tower writes.  The two passes share every weight, but a
16x pass runs the vit_merger after insert_layer, so a tower can tell them
apart.  The language model takes no part; CKPT's is kept, and its tower is
where the student starts (graft.py picks another).

Samples: train-split images from --first on (default: after the last
tower_code.py / tower_distill.py stage of CKPT), the tasks in turn, --batch a
step.  Every --every steps it prints each kind's relative error on fixed val
images (squared error over the teacher's square, summed over tokens).
Writes CKPT with the new tower to --save at the end, or when sent SIGTERM or
SIGINT (it finishes the step, then saves).
"""
import argparse
import os
import signal
import sys
import time
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import compact     # noqa: E402
import synth       # noqa: E402
from model import MiniCPMV, image_to_crops, tower_from_dict   # noqa: E402
from train import tower_feats   # noqa: E402
from tower_code import Tail, apply, finish   # noqa: E402

SCENE_TASKS = ('scene_caption', 'scene_count', 'scene_left')
TEXT_TASKS = ('receipt_read', 'screenshot_read', 'word_read', 'snippet_read')
MERGE = {'scene': 4, 'text': 2}     # 16x for scenes, 4x for reading


def kind(task):
    return 'scene' if task.startswith('scene_') else 'text'


def encode(vc, split, i, task):
    """The crops of sample i of task, at its kind's merge."""
    s = synth.sample(split, i, task=task)
    k = kind(task)
    return dict(crops=image_to_crops(s['image'], vc, MERGE[k])[0], merge=MERGE[k], kind=k)


def tower_of(path, vc, text_hidden):
    """A checkpoint's vision tower, frozen, in a holder tower_feats takes (its shape must be
    vc's; a tower-only file will do).  Only the tower is built: a teacher needs no language model."""
    d = compact.load(path)
    v = tower_from_dict(d)
    if v.v != vc or d['config']['text']['hidden'] != text_hidden:
        sys.exit(f'tower_distill: {path}: its tower has another shape than --ckpt\'s')
    v.requires_grad_(False)
    return types.SimpleNamespace(vision=v.eval())


def targets(teachers, seqs):
    """{kind: that kind's teacher's rows of seqs, keyed (index in seqs, crop)}."""
    out = {}
    for k, t in teachers.items():
        idx = [si for si, sq in enumerate(seqs) if sq['kind'] == k]
        if idx:
            with torch.no_grad():
                rows = tower_feats(t, [seqs[si] for si in idx])
            out[k] = {(idx[j], ci): r for (j, ci), r in rows.items()}
    return out


def errors(student, want, seqs):
    """{kind: (squared error summed, teacher's square summed)} of the student's rows against
    targets(teachers, seqs)."""
    feats = tower_feats(student, seqs)
    return {k: (sum((feats[key] - r).pow(2).sum() for key, r in rows.items()),
                sum(r.pow(2).sum() for r in rows.values()))
            for k, rows in want.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True, help='the student: its tower is trained, its language model kept')
    ap.add_argument('--scenes', required=True, metavar='CKPT', help='the tower whose rows scenes at 16x learn')
    ap.add_argument('--text', required=True, metavar='CKPT', help='the tower whose rows text at 4x learns')
    ap.add_argument('--save', required=True, metavar='FILE')
    ap.add_argument('--tasks', default=','.join(SCENE_TASKS + TEXT_TASKS))
    ap.add_argument('--steps', type=int, default=0, help='stop after this many steps (else --minutes)')
    ap.add_argument('--minutes', type=float, default=30)
    ap.add_argument('--lr', type=float, default=3e-4)
    ap.add_argument('--batch', type=int, default=4)
    ap.add_argument('--first', type=int, default=None, help='first train-split sample (default: after the last stage)')
    ap.add_argument('--every', type=int, default=50, help='steps between report lines')
    ap.add_argument('--n', type=int, default=16, help='val images per kind in a report')
    ap.add_argument('--save-every', type=float, default=0, metavar='MIN')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.batch < 1 or a.steps < 0 or a.n < 1 or a.every < 1:
        sys.exit('tower_distill: --batch, --n and --every must be at least 1, --steps not negative')
    for f in (a.ckpt, a.scenes, a.text):
        if not os.path.exists(f):
            sys.exit(f'tower_distill: {f}: no such file')
    tasks = a.tasks.split(',')
    for t in tasks:
        if t not in synth.TASKS + synth.TRAIN_TASKS or t == 'text':
            sys.exit(f'tower_distill: {t}: not an image task')
    d = compact.load(a.ckpt)
    model = MiniCPMV.from_config(d['config'])
    model.load_state_dict(d['model'])
    model.text.requires_grad_(False)
    vc = model.vc
    teachers = {'scene': tower_of(a.scenes, vc, model.tc.hidden), 'text': tower_of(a.text, vc, model.tc.hidden)}
    params = [p for p in model.vision.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    st = d['state']
    if a.first is None:   # after the samples any earlier tower stage drew (77M: past every stage so far)
        a.first = max(st.get(k, {}).get('first_next') or 0 for k in ('tower_code', 'tower_distill')) or 77_000_000
    scene_t = [t for t in tasks if kind(t) == 'scene']
    text_t = [t for t in tasks if kind(t) == 'text']
    val = [encode(vc, 'val', 3000 + i, ts[i % len(ts)]) for ts in (scene_t, text_t) if ts for i in range(a.n)]
    val_want = targets(teachers, val)    # the teachers are frozen: their val rows once

    def report():
        model.eval()
        with torch.no_grad():
            e = errors(model, val_want, val)
        model.train()
        return '  '.join(f'{k} rel err {float(a_) / max(1e-12, float(b_)):.4f}' for k, (a_, b_) in sorted(e.items()))

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    step = n = 0

    def save(path):
        d['model'] = model.state_dict()
        d['opt'] = None
        d['state'] = dict(st, tower_distill=dict(
            steps=step, samples=n, lr=a.lr, tasks=tasks, scenes=a.scenes, text=a.text, first_next=a.first + n))
        compact.save(d, path)

    print(f'tower_distill step 0: {report()}', flush=True)
    tail = Tail('tower_distill', a.every, a.save_every, save, a.save)
    while not stop and (step < a.steps if a.steps else time.time() - tail.t0 < a.minutes * 60):
        seqs = [encode(vc, 'train', a.first + n + j, tasks[(n + j) % len(tasks)]) for j in range(a.batch)]
        n += a.batch
        for g in opt.param_groups:
            g['lr'] = a.lr * min(1.0, (step + 1) / 30)
        # each kind's error over its teacher's square, so neither kind's scale rules
        loss = sum(e / w.clamp_min(1e-12) for e, w in errors(model, targets(teachers, seqs), seqs).values())
        apply(opt, params, loss, 'tower_distill', step)
        step += 1
        tail(step, n, loss, report)
    finish(save, a.save, 'tower_distill', bool(stop), step, n)


if __name__ == '__main__':
    main()
