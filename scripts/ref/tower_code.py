#!/usr/bin/python3
"""Teach the vision tower to write the scene code the language model reads.

    scripts/ref/tower_code.py --ckpt CKPT --save OUT [--reinit-vision SEED] [--minutes 30] [--lr 1e-3]

The tower's output rows on scene images are pulled (mean squared error, every
token of every crop) onto scene_code's rows: at the token holding a shape's
centre, the language model's embeddings of its size, colour and shape words
summed; zero elsewhere.  The language model takes no part (no forward, no
backward): the tower gets a direct target at every token instead of the
trickle of gradient the answer tokens send it, which in session 10 left
colour at chance after 11k samples.  oracle_read.py --feats words teaches a
language model to read the same code; the two halves then go together.

The code is the one stored in --code's checkpoint ('scene_code', written by
oracle_read.py --feats words --save), else CKPT's own, else built from CKPT's
embeddings (times --scale).
Samples: scene images of the train split from --first on, half 16x, half 4x.
Every --every steps it prints what the rows say on fixed val scenes: over the
tokens holding exactly one shape, the share whose nearest code row has the
right colour, shape and size; and the RMS of the rows of empty tokens.
--blank-overview pulls a text image's overview (when it has tiles) to zero, the
rows the language model learnt to read there (oracle_read.py).
--dense N adds N dense text crops a step with a linear head naming each patch's
glyphs (glyph recognition, which the glyph code needs first: session 23 found the
code itself not learnt from the shipped tower in 4,000 samples); the head is saved
('dense_head') and a later stage goes on with it.
Writes CKPT with the new tower (and the code) to --save at the end, or
when sent SIGTERM or SIGINT (it finishes the step, then saves: a long run
can be stopped when the session's time is up without losing it).
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import bpe         # noqa: E402
import chatfmt     # noqa: E402
import compact     # noqa: E402
import glyph_code  # noqa: E402
import oracle_read  # noqa: E402
import scene_code  # noqa: E402
import synth       # noqa: E402
from model import MiniCPMV, VitLayer   # noqa: E402
from train import dense_batch, tower_feats   # noqa: E402
import probe       # noqa: E402

TASKS = ('scene_caption', 'scene_count', 'scene_left')


def encode(tok, vc, split, i, merge, tasks=TASKS, slots=False):
    """Sample i of tasks[i % len(tasks)], encoded with its marks: a scene's 'scene_t' (probe.targets),
    a text image's 'glyph_t' (glyph_code.targets per crop, slots as the code has them; None for an
    overview with tiles, whose index goes to 'overview')."""
    marks = []
    s = synth.sample(split, i, task=tasks[i % len(tasks)], marks=marks)
    sq = oracle_read.encode(tok, vc, dict(s, marks=marks), merge)
    if 'cells' in sq:
        f = vc.patch * merge
        sq['glyph_t'] = [None if ci == 0 and len(sq['crops']) > 1 else
                         glyph_code.targets(sq['cells'][ci], (c.shape[1] // f) * (c.shape[2] // f), slots)
                         for ci, c in enumerate(sq['crops'])]
        if len(sq['crops']) > 1:
            sq['overview'] = 0
    return sq


def code_loss(feats, seqs, table, ce=0.0, temp=4.0, glyphs=None, extra=None, extra_w=None, blank=False):
    """Per kind of crop (scenes; text, glyphs=(E, P)): mean squared error of the rows against the
    code, divided by the code's mean square (so its scale does not matter), plus ce x the code's
    cross-entropy (scene_code.group_ce, glyph_code.ce); the kinds' losses summed.  extra: dict(kind,
    table): scene tokens also carry scene_code's extra of that kind, with its own CE.
    blank: a text image's overview (when it has tiles) is pulled to zero like an empty token:
    oracle_read.py trains the language model on zero rows there, and session 29 found the
    tower's unchecked overview rows cost receipt totals 0.56 -> 0.44 over the exact code."""
    scene = [k for k in sorted(feats) if 'scene_t' in seqs[k[0]]]
    text = [k for k in sorted(feats) if 'glyph_t' in seqs[k[0]] and seqs[k[0]]['glyph_t'][k[1]] is not None]
    loss = 0.0
    if scene:
        x = torch.cat([feats[k] for k in scene])
        t = torch.cat([seqs[si]['scene_t'][ci] for si, ci in scene])
        want = scene_code.rows(t, table)
        if extra is not None:
            o = torch.cat([scene_code.pick(seqs[si]['extra_t'], extra['kind'], ci) for si, ci in scene])
            want = want + o @ extra['table']
        loss = loss + F.mse_loss(x, want) / want.pow(2).mean().clamp_min(1e-12)
        if ce > 0:
            loss = loss + ce * scene_code.group_ce(x, t, table, temp)
            if extra is not None:
                loss = loss + ce * scene_code.extra_ce(x, t, o, extra['table'], extra['kind'], temp, extra_w)
    if text:
        E, P = glyphs
        sq, want, ces = 0.0, 0.0, 0.0
        for si, ci in text:
            x, tg = feats[(si, ci)], seqs[si]['glyph_t'][ci]
            w = glyph_code.rows(tg, E, P, x.shape[0])
            sq, want = sq + (x - w).pow(2).sum(), want + w.pow(2).sum()
            ces = ces + glyph_code.ce(x, tg, E, P, temp) / len(text)
        if blank:
            sq = sq + sum(feats[(si, seqs[si]['overview'])].pow(2).sum()
                          for si in sorted({si for si, _ in text}) if 'overview' in seqs[si])
        loss = loss + sq / want.clamp_min(1e-12)
        if ce > 0:
            loss = loss + ce * ces
    return loss


@torch.no_grad()
def report(model, val, table, glyphs=None, extra=None):
    model.eval()
    tot = {}

    def add(k, mg, a, b):
        ra, rb = tot.get((k, mg), (0, 0))
        tot[(k, mg)] = (ra + a, rb + b)

    feats = tower_feats(model, val)
    for si, sq in enumerate(val):
        for ci, t in enumerate(sq.get('scene_t', ())):
            for k, (a, b) in scene_code.decode(feats[(si, ci)], t, table).items():
                add(k, sq['merge'], a, b)
            if extra is not None:
                for k, (a, b) in scene_code.extra_decode(feats[(si, ci)], t, scene_code.pick(
                        sq['extra_t'], extra['kind'], ci), extra['table'], extra['kind']).items():
                    add(k, sq['merge'], a, b)
        for ci, tg in enumerate(sq.get('glyph_t', ())):
            if tg is not None:
                (a, b), (e, ne) = glyph_code.decode(feats[(si, ci)], tg, *glyphs)
                add('glyph', sq['merge'], a, b)
                add('text empty', sq['merge'], e, ne)
        if 'overview' in sq:
            x = feats[(si, sq['overview'])]
            add('overview', sq['merge'], float(x.pow(2).sum()), x.numel())
    model.train()
    cols = []
    for mg, name in ((4, '16x'), (2, '4x')):
        if ('glyph', mg) in tot:
            e = tot[('text empty', mg)]
            cols.append(f"{name} text: glyph {tot[('glyph', mg)][0] / max(1, tot[('glyph', mg)][1]):.3f} "
                        f"empty rms {(e[0] / max(1, e[1])) ** 0.5:.3f}"
                        + (f" overview rms {(o[0] / max(1, o[1])) ** 0.5:.3f}" if (o := tot.get(('overview', mg))) else ''))
        if ('empty', mg) not in tot:
            continue
        parts = [f'{g} {tot[(g, mg)][0] / max(1, tot[(g, mg)][1]):.2f}'
                 for g in [g for g, _ in scene_code.GROUPS] + ['small shape'] + (scene_code.parts(extra['kind']) if extra else [])]
        e = tot[('empty', mg)]
        parts.append(f'empty rms {(e[0] / max(1, e[1])) ** 0.5:.3f}')
        cols.append(f'{name}: ' + ' '.join(parts))
    return '  '.join(cols)


def grow(model, n):
    """Append n ViT layers to model's tower, each the identity at first (its attention output and
    MLP down projections zero), so the grown tower writes the rows it wrote before."""
    for _ in range(n):
        L = VitLayer(model.vc)
        for lin in (L.o, L.down):
            torch.nn.init.zeros_(lin.weight)
            torch.nn.init.zeros_(lin.bias)
        model.vision.layers.append(L)
    model.vc.n_layer += n


def apply(opt, params, loss, who, step):
    """One optimiser step on loss, gradients clipped to norm 1; a non-finite loss ends the run
    with nothing written."""
    if not torch.isfinite(loss):
        sys.exit(f'{who}: step {step}: non-finite loss; nothing written')
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


class Tail:
    """The end of each step of a tower stage: a report line every `every` steps (the mean loss
    since the last line, then report()'s text) and save(path + '.part') every save_every
    minutes (0: never), so a crash or a lost machine keeps the stage so far."""

    def __init__(self, who, every, save_every, save, path):
        self.who, self.every, self.save_every, self.save, self.path = who, every, save_every, save, path
        self.t0 = self.saved = time.time()
        self.run = 0.0

    def __call__(self, step, n, loss, report):
        self.run += float(loss)
        if step % self.every == 0:
            print(f'{self.who} step {step} ({n} samples, {time.time() - self.t0:.0f} s): '
                  f'loss {self.run / self.every:.4f}  ' + report(), flush=True)
            self.run = 0.0
        if self.save_every and time.time() - self.saved > self.save_every * 60:
            self.save(self.path + '.part')
            self.saved = time.time()
            print(f'{self.who}: wrote {self.path}.part ({step} steps)', flush=True)


def finish(save, path, who, stopped, step, n):
    """The end of a tower stage: save(path) (stopped: a signal asked for it), the .part gone."""
    if stopped:
        print(f'{who}: stopped by a signal after {n} samples; saving', flush=True)
    save(path)
    if os.path.exists(path + '.part'):
        os.remove(path + '.part')
    print(f'{who}: wrote {path} ({step} steps, {n} samples)', flush=True)


def weights_arg(s):
    """argparse type of --extra-weight: 'part=w,part=w' -> {part: w}."""
    out = {}
    for item in filter(None, s.split(',')):
        k, _, w = item.partition('=')
        try:
            if k not in scene_code.EXTRAS:
                raise ValueError
            out[k] = float(w)
        except ValueError:
            raise argparse.ArgumentTypeError(f'{item!r}: want PART=WEIGHT, PART one of {", ".join(scene_code.EXTRAS)}')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True, help='checkpoint whose tower is trained (or replaced: --reinit-vision)')
    ap.add_argument('--save', required=True, metavar='FILE')
    ap.add_argument('--code', metavar='CKPT', help="take the code from this checkpoint's 'scene_code'")
    ap.add_argument('--scale', type=float, default=1.0, help='the code built from CKPT: word embeddings times this')
    ap.add_argument('--ce', type=float, default=0.0,
                    help='weight of a cross-entropy per colour/shape/size group, the code words as logits, '
                         'at the tokens holding one shape (MSE alone left shapes near chance for 6k samples)')
    ap.add_argument('--ce-temp', type=float, default=4.0, help='scene_code.group_ce temp (session 11 began at 1)')
    ap.add_argument('--reinit-vision', type=int, metavar='SEED', help='start from a fresh tower (this seed)')
    ap.add_argument('--tasks', default=','.join(TASKS),
                    help='comma-separated tasks drawn in turn: scene tasks get the scene code, reading tasks '
                         '(receipt_*, screenshot_read, word_read, snippet_read) the glyph code')
    ap.add_argument('--glyph-scale', type=float, default=0.0,
                    help="glyph code = glyph embeddings times this (default: a glyph's row as long as a scene "
                         "label's)")
    ap.add_argument('--glyph-bind', type=glyph_code.bind_arg, default=1.0, metavar='W',
                    help='places of the glyph code: (1 - W) + W x signs (glyph_code.tables; 1 = signs alone; a CKPT with a glyph code keeps its own)')
    ap.add_argument('--extra', type=scene_code.kind_arg, metavar='KIND[+KIND]',
                    help=scene_code.EXTRA_HELP + " (--code's, else CKPT's)")
    ap.add_argument('--extra-weight', type=weights_arg, default={}, metavar='PART=W[,PART=W]',
                    help="weight of an extra part's CE (default 1 each), e.g. nshape=5: a part the tower "
                         "has not learned gets more of the gradient")
    ap.add_argument('--grow', type=int, default=0, metavar='N',
                    help='append N ViT layers to the tower first, each starting as the identity (output '
                         'projections zero): session 19 found one attention layer on the last layer\'s '
                         'rows learns nshape (0.85) where the tower\'s own layers stay at 0.69')
    ap.add_argument('--freeze-below', type=int, default=0, metavar='L',
                    help='the patch embedding, positions, merger and ViT layers below L do not train '
                         '(they run without a graph, so a step costs less)')
    ap.add_argument('--dense', type=int, default=0, metavar='N',
                    help='per step also N dense text crops (synth.dense_text) through the tower, a linear head '
                         'naming the glyphs of each patch (probe.patch_loss, as train.py --dense and '
                         'glyph_rate.py): glyph recognition for the reading codes to build on')
    ap.add_argument('--dense-weight', type=float, default=1.0, help='weight of the --dense loss')
    ap.add_argument('--dense-first', type=int, default=None,
                    help='first dense crop index (train split; above what the samples and glyph_rate.py draw)')
    ap.add_argument('--blank-overview', action='store_true',
                    help="pull a text image's overview rows (when it has tiles) to zero, as the language model "
                         'reads them (oracle_read.py); the report shows their RMS either way')
    ap.add_argument('--minutes', type=float, default=30)
    ap.add_argument('--samples', type=int, default=0, help='stop after this many samples instead (a replayable stage)')
    ap.add_argument('--steps', type=int, default=0, help='stop after this many steps instead (replayable, --batch 0 too)')
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--batch', type=int, default=16,
                    help='code samples a step; 0 with --dense: dense crops alone (the scenes only reported)')
    ap.add_argument('--bf16', action='store_true',
                    help="the tower's matmuls under CPU bf16 autocast (weights stay float32): session 26 measured "
                         'the same glyph recall per crop as float32 at ~1.4x the crops a second')
    ap.add_argument('--save-every', type=float, default=0, metavar='MIN',
                    help='also write --save + ".part" every MIN minutes (a crash or a lost machine keeps the '
                         'last one; removed when --save is written)')
    ap.add_argument('--every', type=int, default=50, help='steps between report lines')
    ap.add_argument('--n', type=int, default=24, help='val scenes per merge in a report')
    ap.add_argument('--first', type=int, default=None,
                    help="first train-split index drawn (default: after the samples of --ckpt's own tower_code "
                         'stage, else 70000000)')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.batch < 0 or (a.batch == 0 and not a.dense) or a.dense < 0:
        sys.exit('tower_code: --batch 0 needs --dense N (N > 0); neither may be negative')
    if a.batch == 0 and a.samples:
        sys.exit('tower_code: --samples counts code samples; with --batch 0 give --steps or --minutes')
    unused = set(a.extra_weight) - set(scene_code.parts(a.extra) if a.extra else ())
    if unused:
        sys.exit(f'tower_code: --extra-weight {",".join(sorted(unused))}: not a part of --extra {a.extra or "(none)"}')
    for f in (a.ckpt, a.code):
        if f and not os.path.exists(f):
            sys.exit(f'tower_code: {f}: no such file')
    d = compact.load(a.ckpt)
    model = MiniCPMV.from_config(d['config'])
    model.load_state_dict(d['model'])
    tok = bpe.default()
    if a.code:
        c = compact.load(a.code)
        if 'scene_code' not in c:
            sys.exit(f'tower_code: {a.code} has no scene_code (write one with oracle_read.py --feats words --save)')
        table = c['scene_code']
    elif 'scene_code' in d:
        table = d['scene_code']
    else:
        table = scene_code.word_table(model, tok, a.scale)
    extra = None
    if a.extra:
        extra = scene_code.extra_of(c if a.code else d, a.extra, model, tok, table)
    if a.reinit_vision is not None:
        torch.manual_seed(a.reinit_vision)
        model.vision.load_state_dict(MiniCPMV(model.tc, model.vc).vision.state_dict())
    if a.grow:
        grow(model, a.grow)
        d['config']['vision']['n_layer'] = model.vc.n_layer
        print(f'tower_code: the tower grown to {model.vc.n_layer} layers', flush=True)
    model.text.requires_grad_(False)
    if a.freeze_below:
        vis = model.vision
        for mod in [vis.patch, vis.merger] + list(vis.layers[:a.freeze_below]):
            mod.requires_grad_(False)
        vis.pos.requires_grad_(False)
    params = [p for p in model.vision.parameters() if p.requires_grad]
    # a later leg goes on with the samples and crops after the last one's (older
    # checkpoints did not record them: their legs passed --first / --dense-first)
    last = d['state'].get('tower_code', {})
    if a.first is None:
        a.first = last.get('first_next') or 70_000_000
    head = dense_val = None
    if a.dense:
        # a head from an earlier stage goes on learning; a new one starts at the labels' prior
        head = probe.new_patch_head(model.vc.width)
        if 'dense_head' in d:
            head.load_state_dict(d['dense_head'])
        params = params + list(head.parameters())
        dense_val = dense_batch(model.vc, 'val', range(48))
        if a.dense_first is None:
            a.dense_first = last.get('dense_next') or 95_000_000   # None: its stages had no crops
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)

    def glyph_recall():
        if head is None:
            return ''
        model.eval()
        h, n = probe.patch_recall_over(head, patch_rows, *dense_val)
        model.train()
        return f'  dense glyph recall {h / max(1, n):.3f}'

    def patch_rows(px):
        return model.vision.patch_rows(px, a.bf16)

    vc = model.vc
    tasks = a.tasks.split(',')
    for t in tasks:
        if t not in synth.TASKS + synth.TRAIN_TASKS or t == 'text':
            sys.exit(f'tower_code: {t}: not an image task')
    glyphs, slots = None, False
    if any(not t.startswith('scene_') for t in tasks):
        if 'glyph_code' in d:      # a tower that has learnt a glyph code keeps it
            E, P, slots = glyph_code.stored(d)
            glyphs = (E, P)
            print(f"tower_code: the glyph code of {a.ckpt}{' (slots)' if slots else ''}", flush=True)
        else:
            E, P = glyph_code.tables(model, tok, bind=a.glyph_bind)
            scale = a.glyph_scale or float(table[table.abs().sum(1) > 0].norm(dim=1).mean() / E.norm(dim=1).mean())
            glyphs = (E * scale, P)
            print(f'tower_code: glyph code = glyph embeddings x {scale:.3f}, bind {a.glyph_bind}', flush=True)
    # val: --n samples per merge, the tasks in turn (a report is one tower batch)
    val = [encode(tok, vc, 'val', 2000 + i, mg, tasks, slots) for mg in (4, 2) for i in range(a.n)]
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    step = n = 0

    def save(path):
        d['model'] = model.state_dict()
        d['opt'] = None
        d['scene_code'] = table
        if extra is not None:
            d['scene_extra'] = extra
        if glyphs is not None:
            d['glyph_code'] = glyph_code.store(*glyphs, slots)
        if head is not None:
            d['dense_head'] = head.state_dict()
        d['state'] = dict(d['state'], tower_code=dict(
            samples=n, steps=step, lr=a.lr, reinit=a.reinit_vision, ce=a.ce, ce_temp=a.ce_temp, tasks=tasks,
            extra=a.extra, extra_weight=a.extra_weight, grow=a.grow, freeze_below=a.freeze_below, dense=a.dense,
            dense_weight=a.dense_weight, blank_overview=a.blank_overview, first_next=a.first + n,
            dense_next=(a.dense_first + step * a.dense) if a.dense else last.get('dense_next')))
        compact.save(d, path)

    print(f'tower_code step 0: {report(model, val, table, glyphs, extra)}{glyph_recall()}', flush=True)
    tail = Tail('tower_code', a.every, a.save_every, save, a.save)

    def more():
        if a.steps:
            return step < a.steps
        return (n < a.samples) if a.samples else (time.time() - tail.t0 < a.minutes * 60)

    while not stop and more():
        seqs = [encode(tok, vc, 'train', a.first + n + j, (4, 2)[(n + j) % 2], tasks, slots) for j in range(a.batch)]
        n += a.batch
        for g in opt.param_groups:
            g['lr'] = a.lr * min(1.0, (step + 1) / 30)
        loss = code_loss(tower_feats(model, seqs, vision_bf16=a.bf16), seqs, table, a.ce, a.ce_temp, glyphs, extra,
                         a.extra_weight, a.blank_overview) if seqs else 0.0
        if head is not None:
            i0 = a.dense_first + step * a.dense
            px, tg = dense_batch(vc, 'train', range(i0, i0 + a.dense))
            loss = loss + a.dense_weight * probe.patch_loss(head, patch_rows(px), tg)
        apply(opt, params, loss, 'tower_code', step)
        step += 1
        tail(step, n, loss, lambda: report(model, val, table, glyphs, extra) + glyph_recall())
    finish(save, a.save, 'tower_code', bool(stop), step, n)


if __name__ == '__main__':
    main()
