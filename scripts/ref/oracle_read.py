#!/usr/bin/python3
"""Is reading held back by the tower or by the language model?

    scripts/ref/oracle_read.py --ckpt CKPT --feats oracle|tower|frozen [--tasks snippet_read] [--minutes 15]
    scripts/ref/oracle_read.py --ckpt CKPT --feats labels|tower|frozen --tasks scene_caption

Fine-tunes a checkpoint's language model on reading tasks, with one of three
sources for the image rows it reads:

  oracle  perfect glyph information: each token's row is the sum of a learned
          vector per (glyph, place in the token's cell on an 8x4 grid) over
          the glyphs whose centre lies in the cell (synth marks); nothing a
          tower could know better;
  tower   the checkpoint's tower, trained along (what the run does);
  frozen  the checkpoint's tower, not trained;
  labels  (scene tasks) perfect scene information: the token holding a shape's
          centre gets a learned vector per label (its colour, shape, size:
          the probe's labels, probe.targets) summed; every other token zero;
  words   (scene tasks) as labels, but the vectors fixed: the language
          model's own embeddings of the words (scene_code.py), the code
          tower_code.py teaches a tower to write;
  glyphs  (reading tasks) a fixed code: each glyph's own embedding bound to
          its place in the token by fixed signs (glyph_code.py; times
          --scale), the code tower_code.py --tasks receipt_read,... writes.

and prints, as it goes, the answer cross-entropy of fixed val samples over
all answer tokens and over the digit tokens (which no prior can guess; a
model that reads gets them near 0 nats, one that guesses ~2.3); on scene
tasks, over the colour and shape words instead (chance ln 7 = 1.95 and
ln 5 = 1.61 nats).  If the
oracle's digits fall fast, the language model can read and the tower is what
to train; if they do not, the language model's reading is the bottleneck.
Samples come from train-split indices far above any a run draws; images
alternate 16x and 4x.  Nothing is saved unless --save names a file: then the
checkpoint with the fine-tuned language model (and tower, with --feats tower),
the code in 'scene_code' with --feats words.

  --factored     oracle vectors as glyph vector x place vector (shared across
                 places): session 8 found the language model reads words in
                 order from these within ~3,000 samples, and not from
                 per-pair vectors (examples/models/README.md);
  --digits N     word_read strings replaced by N random digits;
  --distill W    (tower) also pull a linear map of the tower rows onto fixed
                 random factored rows: can the tower learn such codes?
  --guide W      guided reading attention (guide.py);
  --fprobe W     (tower) a factored token head (fprobe.py) asking the tower
                 for glyph codes shared across places; --fprobe-mode place|slot.
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

import bpe       # noqa: E402
import chatfmt   # noqa: E402
import compact   # noqa: E402
import fprobe    # noqa: E402
import glyph_code   # noqa: E402
import guide     # noqa: E402
import probe     # noqa: E402
import scene_code   # noqa: E402
import synth     # noqa: E402
from image_use import answer_ce, val_samples   # noqa: E402
from model import MiniCPMV, set_fast_training   # noqa: E402
from train import answer_logits, build_batch, loss_fn, tower_feats   # noqa: E402

GX, GY = 8, 4     # places inside a token's cell the oracle tells apart


class Oracle(torch.nn.Module):
    """Image rows from glyph marks: a vector per (glyph, place in cell), summed per token.
    factored: the vector is glyph vector x place vector (elementwise), so what is learnt
    about a glyph at one place carries to the others."""

    def __init__(self, hidden, std, factored=False):
        super().__init__()
        self.factored = factored
        if factored:
            self.glyph = torch.nn.Parameter(torch.randn(probe.N_GLYPH, hidden) * std)
            self.place = torch.nn.Parameter(1.0 + 0.5 * torch.randn(GX * GY, hidden))
        else:
            self.table = torch.nn.Parameter(torch.randn(probe.N_GLYPH * GX * GY, hidden) * std)

    def vectors(self, idx):
        if not self.factored:
            return self.table[idx]
        return self.glyph[idx // (GX * GY)] * self.place[idx % (GX * GY)]

    def rows(self, cells, n_tok):
        idx, tok = [], []
        for ti, ch, (fx, fy) in cells:
            g = ord(ch) - 33
            if 0 <= g < probe.N_GLYPH:
                idx.append((g * GY + min(GY - 1, int(fy * GY))) * GX + min(GX - 1, int(fx * GX)))
                tok.append(ti)
        p = next(self.parameters())
        out = p.new_zeros(n_tok, p.shape[1])
        if idx:
            out = out.index_add(0, torch.tensor(tok), self.vectors(torch.tensor(idx)))
        return out


class GlyphCode:
    """glyph_code's fixed rows, in the Oracle's terms (rows of a crop's cells)."""

    def __init__(self, E, P, slots=False):
        self.E, self.P, self.slots = E, P, slots

    def rows(self, cells, n_tok):
        return glyph_code.rows(glyph_code.targets(cells, n_tok, self.slots), self.E, self.P, n_tok)


class MixedCode:
    """--keep-scenes: text samples read the glyph code, scene samples the scene code."""

    def __init__(self, glyph, scene):
        self.glyph, self.scene = glyph, scene


class LabelOracle(torch.nn.Module):
    """Image rows from scene marks: a learned vector per probe label, summed per token."""

    def __init__(self, hidden, std):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(len(synth.MARK_LABELS), hidden) * std)
        self.extra = None     # --feats words --extra: dict(kind, table) of scene_code.extra_table, added


def encode(tok, vc, s, merge, spell=False):
    sq = chatfmt.encode_sample(tok, s, vc, merge, spell=spell)
    if all(isinstance(w, str) for _, _, w in s['marks']):
        sq['cells'] = probe.crop_cells(s['marks'], s['image'].size, vc, merge, fine=True)
        sq['guide'] = guide.targets(tok, sq, s['marks'], vc, merge, s['image'].size)
    else:
        shapes = [c.shape for c in sq['crops']]
        sq['scene_t'] = probe.targets(s['marks'], s['image'].size, vc, merge, shapes,
                                     synth.mark_labels, len(synth.MARK_LABELS))
        sq['extra_t'] = {k: scene_code.extra_targets(k, s['marks'], s['image'].size, vc, merge, shapes)
                         for k in scene_code.EXTRAS}
    return sq


def scene_word_ce(model, tok, sq, feats):
    """(mean answer CE, CE summed over the colour and shape words' tokens, their count)."""
    b = build_batch(model, [sq], feats=feats)
    with torch.no_grad():
        logits, tgt = answer_logits(model, b, model.text(b['emb'], b['pos'], mask=b['mask']))
        ce = F.cross_entropy(logits, tgt, reduction='none')
    words = set(synth.COLOURS) | set(synth.SHAPES) | set(synth.PLURAL.values())
    sel = torch.tensor([tok.decode([int(t)]).strip() in words for t in tgt])
    return ce.mean().item(), ce[sel].sum().item(), int(sel.sum())


def oracle_feats(oracle, vc, seqs):
    if isinstance(oracle, MixedCode):
        out = {}
        for kind, o in (('scene_t', oracle.scene), ('cells', oracle.glyph)):
            idx = [si for si, sq in enumerate(seqs) if kind in sq]
            if idx:
                rows = oracle_feats(o, vc, [seqs[si] for si in idx])
                out.update({(idx[j], ci): v for (j, ci), v in rows.items()})
        return out
    if isinstance(oracle, LabelOracle):
        return {(si, ci): t @ oracle.table + (0 if oracle.extra is None else
                                              scene_code.pick(sq['extra_t'], oracle.extra['kind'], ci) @ oracle.extra['table'])
                for si, sq in enumerate(seqs) for ci, t in enumerate(sq['scene_t'])}
    feats = {}
    for si, sq in enumerate(seqs):
        f = vc.patch * sq['merge']
        for ci, c in enumerate(sq['crops']):
            feats[(si, ci)] = oracle.rows(sq['cells'][ci], (c.shape[1] // f) * (c.shape[2] // f))
            if isinstance(oracle, GlyphCode) and ci == 0 and len(sq['crops']) > 1:
                feats[(si, ci)] = feats[(si, ci)] * 0     # as glyph_code: an overview with tiles says nothing
    return feats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ckpt', required=True)
    ap.add_argument('--feats', choices=('oracle', 'labels', 'words', 'glyphs', 'tower', 'frozen'), required=True)
    ap.add_argument('--tasks', default='snippet_read', help='comma-separated training tasks')
    ap.add_argument('--lr', type=float, default=3e-4, help='language model (and tower); the oracle gets 10x')
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--minutes', type=float, default=15)
    ap.add_argument('--samples', type=int, default=0, help='stop after this many samples instead (a replayable stage)')
    ap.add_argument('--every', type=int, default=25, help='steps between val lines')
    ap.add_argument('--n', type=int, default=8, help='val samples per val row')
    ap.add_argument('--rope-base', type=float, help="change the language model's RoPE base first")
    ap.add_argument('--rope-dims', type=int, help="change the language model's rotary dims first (of the head's)")
    ap.add_argument('--fresh-text', action='store_true',
                    help='a freshly initialised language model instead of the checkpoint\'s (the tower is kept)')
    ap.add_argument('--digits', type=int, metavar='N',
                    help='word_read strings replaced by N random digits (the one- and two-digit rows)')
    ap.add_argument('--factored', action='store_true',
                    help='oracle vectors as glyph x place (shared across places) instead of one per pair')
    ap.add_argument('--distill', type=float, default=0.0,
                    help='with --feats tower: weight of a loss pulling a linear map of the tower rows onto '
                         'fixed random factored oracle rows (place-invariant glyph codes); 0 = off')
    ap.add_argument('--guide', type=float, default=0.0,
                    help='weight of the guided reading attention loss (guide.py); 0 = off')
    ap.add_argument('--fprobe', type=float, default=0.0,
                    help='with --feats tower: weight of a factored token head (fprobe.py); 0 = off')
    ap.add_argument('--fprobe-mode', choices=('place', 'slot'), default='slot')
    ap.add_argument('--scale', type=float, default=1.0,
                    help='--feats words, glyphs: the embeddings times this (a CKPT with a code keeps its own)')
    ap.add_argument('--bind', type=glyph_code.bind_arg, default=1.0, metavar='W',
                    help='--feats glyphs: places (1 - W) + W x signs (glyph_code.tables; 1 = signs alone; a CKPT with a glyph code keeps its own)')
    ap.add_argument('--extra', type=scene_code.kind_arg, metavar='KIND[+KIND]',
                    help='--feats words: ' + scene_code.EXTRA_HELP)
    ap.add_argument('--slots', action='store_true',
                    help="(--feats glyphs) a glyph's place is its rank in reading order inside its token "
                         '(glyph_code.targets slots), not its place on the cell grid')
    ap.add_argument('--recode', action='store_true',
                    help="(--feats glyphs) build the glyph code anew from --scale, --bind, --slots and CKPT's "
                         'embeddings, where a CKPT with a glyph code would keep its own')
    ap.add_argument('--first', type=int, default=90_000_000,
                    help='first train-split index drawn (a later leg: the first_next its start checkpoint records)')
    ap.add_argument('--keep-scenes', metavar='TASKS',
                    help='(--feats glyphs) also train on these scene tasks, from the exact scene code of '
                         "CKPT (with --extra), so the language model keeps its scenes while it learns to read")
    ap.add_argument('--spell', action='store_true',
                    help='reading answers one character per token (chatfmt.spelled): the reader copies glyphs '
                         'in order instead of naming whole-word tokens from them')
    ap.add_argument('--save', metavar='FILE', help='write the fine-tuned checkpoint here at the end')
    ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tasks = a.tasks.split(',')
    if a.distill > 0 and a.feats != 'tower':
        sys.exit('oracle_read: --distill trains the tower: give --feats tower')
    if a.fprobe > 0 and a.feats != 'tower':
        sys.exit('oracle_read: --fprobe trains the tower: give --feats tower')
    if not os.path.exists(a.ckpt):
        sys.exit(f'oracle_read: {a.ckpt}: no such file')
    if a.digits:
        synth.word_text = lambda rng: ''.join(str(rng.randint(0, 9)) for _ in range(a.digits))
    scenes = all(t.startswith('scene_') for t in tasks)
    for t in tasks:
        if t not in synth.TASKS + synth.TRAIN_TASKS or t == 'text' or t.startswith('scene_') != scenes:
            sys.exit(f'oracle_read: {t}: want reading tasks or scene tasks, not both')
    keep = a.keep_scenes.split(',') if a.keep_scenes else []
    if (a.slots or a.recode) and a.feats != 'glyphs':
        sys.exit('oracle_read: --slots and --recode are for --feats glyphs')
    if keep and (a.feats != 'glyphs' or any(not t.startswith('scene_') or t not in synth.TASKS for t in keep)):
        sys.exit('oracle_read: --keep-scenes takes scene tasks, with --feats glyphs')
    if a.extra and a.feats != 'words' and not keep:
        sys.exit('oracle_read: --extra is for --feats words or --keep-scenes')
    if scenes and (a.guide or a.fprobe or a.distill or a.digits):
        sys.exit('oracle_read: --guide, --fprobe, --distill and --digits are for reading tasks')
    if (a.feats in ('labels', 'words')) != scenes and a.feats in ('labels', 'words', 'oracle', 'glyphs'):
        sys.exit(f'oracle_read: --feats {a.feats} is for '
                 f'{"reading" if a.feats in ("oracle", "glyphs") else "scene"} tasks')
    d = compact.load(a.ckpt)
    model = MiniCPMV.from_config(d['config'])
    model.load_state_dict(d['model'] if not a.fresh_text else
                          {k: v for k, v in d['model'].items() if not k.startswith('text.')}, strict=not a.fresh_text)
    set_fast_training(model)
    vc, tok = model.vc, bpe.default()
    if a.rope_base:
        model.tc.rope_base = a.rope_base
    if a.rope_dims:
        if a.rope_dims % 2 or not 0 < a.rope_dims <= model.tc.head_dim:
            sys.exit(f'oracle_read: --rope-dims must be even and at most {model.tc.head_dim}')
        model.tc.rope_dims = a.rope_dims
    model.vision.requires_grad_(a.feats == 'tower')
    params = [{'params': list(model.text.parameters()), 'lr': a.lr}]
    if a.feats == 'tower':
        params.append({'params': list(model.vision.parameters()), 'lr': a.lr})
    oracle = None
    val = []
    for name in ('snippet_large', 'snippet_small') if 'snippet_read' in tasks else ():
        val.append((name, val_samples(name, a.n, marks=True)))
    for t in tasks + [t for t in keep if t not in tasks]:
        if t != 'snippet_read':
            val.append((t, val_samples(t, a.n, marks=True)))
    val = [(name, mg, [encode(tok, vc, s, mg, a.spell) for s in ss]) for name, ss in val for mg in (4, 2)]
    if a.feats in ('oracle', 'labels'):
        with torch.no_grad():     # the oracle's rows start at a quarter of the tower's spread
            rows_std = float(torch.cat(list(tower_feats(model, val[0][2][:2]).values())).std())
        oracle = (Oracle(model.tc.hidden, rows_std / 4, a.factored) if a.feats == 'oracle'
                  else LabelOracle(model.tc.hidden, rows_std / 4))
        params.append({'params': list(oracle.parameters()), 'lr': a.lr * 10})
    elif a.feats == 'words':
        oracle = LabelOracle(model.tc.hidden, 0.0)
        # a checkpoint that learnt a code keeps it: its embeddings have moved since
        oracle.table.data = d['scene_code'] if 'scene_code' in d else scene_code.word_table(model, tok, a.scale)
        oracle.table.requires_grad_(False)
        if a.extra:
            oracle.extra = scene_code.extra_of(d, a.extra, model, tok, oracle.table)
    elif a.feats == 'glyphs':
        code = None if a.recode else glyph_code.stored(d)
        if code is None:
            code = glyph_code.tables(model, tok, a.scale, bind=a.bind) + (a.slots,)
        else:
            print(f"oracle_read: the glyph code of {a.ckpt} ({'slots' if code[2] else 'cell grid'}; "
                  "--recode builds one from the options)", flush=True)
        oracle = GlyphCode(*code)
        if keep:
            scene = LabelOracle(model.tc.hidden, 0.0)
            scene.table.data = d['scene_code'] if 'scene_code' in d else scene_code.word_table(model, tok, a.scale)
            scene.table.requires_grad_(False)
            if a.extra:
                scene.extra = scene_code.extra_of(d, a.extra, model, tok, scene.table)
            oracle = MixedCode(oracle, scene)
            tasks = tasks + keep
    target = proj = None
    if a.distill > 0:
        target = Oracle(model.tc.hidden, 1.0, factored=True).requires_grad_(False)
        proj = torch.nn.Linear(model.tc.hidden, model.tc.hidden)
        params.append({'params': list(proj.parameters()), 'lr': a.lr * 10})
    fhead = None
    if a.fprobe > 0:
        fhead = fprobe.FactoredHead(model.tc.hidden, a.fprobe_mode)
        params.append({'params': list(fhead.parameters()), 'lr': a.lr * 10})
    for g in params:
        g['base'] = g['lr']
    opt = torch.optim.AdamW(params, betas=(0.9, 0.95), weight_decay=0.0)

    def feats_of(seqs):
        return oracle_feats(oracle, vc, seqs) if oracle is not None else None

    @torch.no_grad()
    def report(step):
        model.eval()
        cols = []
        for name, mg, seqs in val:
            ce = dig = nd = 0.0
            for sq in seqs:
                c, dg, n = (scene_word_ce if name.startswith('scene_') else answer_ce)(model, tok, sq, feats_of([sq]))
                ce, dig, nd = ce + c / len(seqs), dig + dg, nd + n
            cols.append(f"{name}@{'16x' if mg == 4 else '4x'} {ce:.2f}/{dig / max(nd, 1):.2f}")
        model.train()
        print(f'{a.feats} step {step} ({step * a.batch} samples, {time.time() - t0:.0f} s): '
              + '  '.join(cols) + f"  (answer CE / {'colour+shape word' if scenes else 'digit'} CE"
              + (', colour+shape word CE on scenes)' if keep else ')'), flush=True)

    # SIGTERM / SIGINT: finish the step, report and save (a leg stopped early keeps its work
    # and records where its samples stopped, so the next leg's --first goes on from there)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    t0, step = time.time(), 0
    report(0)
    while not stop and ((step * a.batch < a.samples) if a.samples else (time.time() - t0 < a.minutes * 60)):
        seqs = []
        for j in range(a.batch):
            i = a.first + step * a.batch + j
            marks = []
            s = synth.sample('train', i, task=tasks[i % len(tasks)], marks=marks)
            seqs.append(encode(tok, vc, dict(s, marks=marks), (4, 2)[i % 2], a.spell))
        for g in opt.param_groups:
            g['lr'] = g['base'] * min(1.0, (step + 1) / 20)
        guide.keep(model, a.guide > 0)
        batch = build_batch(model, seqs, feats=feats_of(seqs))
        loss, ce, aux, _ = loss_fn(model, batch, 0.01)
        if target is not None:
            want = oracle_feats(target, vc, seqs)
            keys = sorted(want)
            d_loss = F.mse_loss(proj(torch.cat([batch['feats'][k] for k in keys])),
                                torch.cat([want[k] for k in keys]))
            loss = loss + a.distill * d_loss
        if fhead is not None:
            for sq in seqs:
                sq['fprobe'] = fprobe.cell_targets(sq['cells'], [c.shape for c in sq['crops']], vc, sq['merge'],
                                                   a.fprobe_mode)
            f_loss = fprobe.batch_loss(fhead, batch['feats'], seqs)
            if f_loss is not None:
                loss = loss + a.fprobe * f_loss
        if a.guide > 0:
            g_loss = guide.loss(model, [sq['guide'] for sq in seqs])
            loss = loss + a.guide * g_loss
            guide.keep(model, False)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in params for p in g['params']], 1.0)
        opt.step()
        step += 1
        if step % a.every == 0:
            if a.guide > 0:
                print(f'  guide loss {float(g_loss):.3f}', flush=True)
            if fhead is not None and f_loss is not None:
                print(f'  fprobe ({a.fprobe_mode}) loss {float(f_loss):.3f}', flush=True)
            if target is not None:
                print(f'  distill loss {float(d_loss):.3f}', flush=True)
            report(step)
    if stop:
        print(f'oracle_read: stopped by a signal after {step * a.batch} samples', flush=True)
    report(step)
    if a.save:
        g = (oracle.glyph if keep else oracle) if a.feats == 'glyphs' else None
        d['model'] = model.state_dict()
        d['config'] = model.config_dict()
        d['opt'] = None
        d['state'] = dict(d['state'], oracle_read=dict(feats=a.feats, tasks=tasks, samples=step * a.batch,
                                                       slots=g is not None and g.slots, spell=a.spell,
                                                       first=a.first, first_next=a.first + step * a.batch))
        if a.feats == 'words':
            d['scene_code'] = oracle.table.detach().clone()
            if oracle.extra is not None:
                d['scene_extra'] = oracle.extra
        if g is not None:
            d['glyph_code'] = glyph_code.store(g.E, g.P, g.slots)
        if keep:
            d['scene_code'] = oracle.scene.table.detach().clone()
            if oracle.scene.extra is not None:
                d['scene_extra'] = oracle.scene.extra
        compact.save(d, a.save)
        print(f'oracle_read: wrote {a.save}', flush=True)


if __name__ == '__main__':
    main()
