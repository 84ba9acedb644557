"""A fixed code for what a scene's image tokens should say: the language model's own words.

Session 10 found the language model captions scenes, order included, within
~3,000 samples when each shape's token carries a clean vector per label
(oracle_read.py --feats labels), and not from a tower trained through the
language loss (colour at chance after 11k samples): the tower-to-language
code is what fails.  This module fixes that code in advance, so the two
halves can be taught separately and at once:

  the token holding a shape's centre = emb(" size") + emb(" colour") + emb(" shape"),
  every other token = 0,

with emb the language model's input embedding of the word (mean over its
tokens), copied once and then frozen.  oracle_read.py --feats words teaches
the language model to read it; tower_code.py teaches the tower to write it
(a regression target at every token, no language model in the loop).
"""
import argparse

import torch
import torch.nn.functional as F

import probe
import synth

GROUPS = (('colour', list(synth.COLOURS)), ('shape', list(synth.SHAPES)), ('size', list(synth.SIZES)))


def word_table(model, tok, scale=1.0):
    """(len(synth.MARK_LABELS), hidden): the word embedding of each colour/shape/size label (times
    scale), 0 for the rest."""
    emb = model.text.embed.detach()
    t = torch.zeros(len(synth.MARK_LABELS), emb.shape[1])
    for group, words in GROUPS:
        for w in words:
            ids = tok.encode(' ' + w)
            t[synth.MARK_LABELS.index(f'{group}:{w}')] = emb[torch.tensor(ids)].mean(0) * scale
    return t


def rows(scene_t, table):
    """probe.targets' multi-hot (n_tok, n_labels) of one crop -> the code's rows (n_tok, hidden)."""
    return scene_t @ table


# label ids of each group's words, in GROUPS order
G_IDX = {g: torch.tensor([synth.MARK_LABELS.index(f'{g}:{w}') for w in words]) for g, words in GROUPS}


def combos(table):
    """Every (colour, shape, size) a shape can have: (their label ids (n, 3), their code rows (n, hidden))."""
    ids = torch.cartesian_prod(*(G_IDX[g] for g, _ in GROUPS))
    return ids, table[ids].sum(1)


def single_shape(scene_t):
    """(the tokens holding exactly one shape (bool, n_tok), the tokens holding none)."""
    per_group = torch.stack([scene_t[:, G_IDX[g]].sum(1) for g, _ in GROUPS], 1)
    return (per_group == 1).all(1), per_group.sum(1) == 0


def group_ce(x, scene_t, table, temp=4.0):
    """Cross-entropy, per group and summed, of the code words read as logits (temp x . word / |word|^2)
    at the tokens holding exactly one shape: a classification signal in the code's own terms
    (0 if no token holds exactly one shape).  temp 4: the exact code row then scores its words
    ~4 above the others (CE ~0.1), so the CE does not pull the rows far off the code."""
    one, _ = single_shape(scene_t)
    if not one.any():
        return x.sum() * 0.0
    loss = 0.0
    for g, _ in GROUPS:
        w = table[G_IDX[g]]
        logits = temp * x[one] @ w.T / w.pow(2).sum(1).mean()
        loss = loss + F.cross_entropy(logits, scene_t[one][:, G_IDX[g]].argmax(1))
    return loss


def decode(x, scene_t, table):
    """How much of the rows x (n_tok, hidden) says, against the crop's multi-hot scene_t: over
    the tokens holding exactly one shape, (right, total) per group, the nearest code row over
    every (colour, shape, size) deciding ('small shape': the shape group over small shapes alone);
    over the tokens holding none, (sum of squares, count)."""
    ids, code = combos(table)
    one, empty = single_shape(scene_t)
    out = {}
    near = torch.cdist(x[one], code).argmin(1)
    for gi, (g, _) in enumerate(GROUPS):
        right = scene_t[one][:, G_IDX[g]].argmax(1) == (G_IDX[g][None, :] == ids[near, gi][:, None]).int().argmax(1)
        out[g] = (int(right.sum()), int(one.sum()))
        if g == 'shape':     # small shapes span a patch or two: how much of the miss is theirs
            small = scene_t[one][:, synth.MARK_LABELS.index('size:small')] == 1
            out['small shape'] = (int(right[small].sum()), int(small.sum()))
    out['empty'] = (float(x[empty].pow(2).sum()), int(empty.sum()) * x.shape[1])
    return out


# Extras: where a shape stands, for the language model's search.  With the
# plain code the language model, given exact rows, captions only 0.48 (16x) /
# 0.55 (4x) of the test scenes (session 13): one shape always right, five
# 0.05; it skips and repeats shapes, since finding "the next shape to the
# right" by position is a search its two attention layers, with two rotary
# pairs for the column, do badly.  Two extras, added to a shape's token:
#
#   rank    its rank by centre x among the image's shapes, as the language
#           model's digit embeddings '1'..'5': captions become a lookup by
#           rank (exact rows: 0.93 of test captions after 4,000 samples), but
#           the rank is a global count the tower did not learn (at chance
#           after 8,000 tower samples);
#   column  the patch column (14 px) of its centre, as one of 16 fixed random
#           directions: local, so a tower writes it as easily as the words;
#           a one-hot key lets one attention head prefer the nearest column
#           to the right of the last one named (a query linear in that
#           column's one-hot), the step that positions alone make hard.
#
# Session 15 found counts held back the same way: from exact rows the rank
# language model answered "how many red shapes" with 1 whenever two were red
# (0 of 14) and never said more than 1 for a colour or a shape: an attention
# head that finds the red tokens averages them, so two read as one.  Two more
# extras make the count a lookup, as the rank made the order one:
#
#   ncolour how many of the image's shapes share this shape's colour (1..5),
#   nshape  how many share its shape (1..5),
#
# each as one of 5 fixed random directions (a set of its own, so they do not
# read as the rank's digits).  Like the rank they are global counts the tower
# must learn.  Kinds combine with '+' ('rank+ncolour+nshape'): the parts'
# rows are stacked, each part a block of its own with its own CE.
EXTRAS = ('rank', 'column', 'ncolour', 'nshape')
N_EXTRA = {'rank': 5, 'column': 16, 'ncolour': 5, 'nshape': 5}
SEED = {'column': 1, 'ncolour': 2, 'nshape': 3}


def parts(kind):
    """The single kinds of a (maybe compound) kind, each checked."""
    ks = kind.split('+')
    for k in ks:
        if k not in EXTRAS:
            raise ValueError(f'scene extra {k!r}: not one of {", ".join(EXTRAS)}')
    return ks


def kind_arg(s):
    """argparse type of --extra: a kind or kinds joined by '+'."""
    try:
        parts(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return s


# the --extra help of the tools that take one (oracle_read.py, tower_code.py)
EXTRA_HELP = ("a scene shape's token also carries its rank from the left, its column, how many shapes share "
              "its colour / shape (rank, column, ncolour, nshape; joined by '+'; scene_code.extra_table); a "
              "checkpoint's 'scene_extra' keeps its rows for the parts it has")


def blocks(kind):
    """[(part, first row, row count)] of a kind's stacked table."""
    out, at = [], 0
    for k in parts(kind):
        out.append((k, at, N_EXTRA[k]))
        at += N_EXTRA[k]
    return out


def extra_table(kind, model, tok, like):
    """(rows, hidden), each row scaled to the mean row norm of the word table `like` (word_table's),
    so an extra weighs as much as a word: rank, the embeddings of the digits '1'..'5'; the others,
    fixed random directions (a seed per kind); a compound kind, its parts' rows stacked."""
    emb = model.text.embed.detach()
    want = like[like.abs().sum(1) > 0].norm(dim=1).mean()
    ts = []
    for k in parts(kind):
        if k == 'rank':
            t = torch.stack([emb[torch.tensor(tok.encode(str(i + 1)))].mean(0) for i in range(N_EXTRA[k])])
        else:
            t = torch.randn(N_EXTRA[k], emb.shape[1], generator=torch.Generator().manual_seed(SEED[k]))
        ts.append(t * (want / t.norm(dim=1, keepdim=True)))
    return torch.cat(ts)


def extra_of(d, kind, model, tok, like):
    """The extra of this kind a checkpoint dict d holds ('scene_extra'), else a new one:
    dict(kind, table).  A checkpoint keeps its own rows, for every part it has (its embeddings
    may have moved since, and its tower and language model speak those rows); parts it lacks
    are new."""
    have = d.get('scene_extra')
    if have and have.get('kind') == kind:
        return have
    new = extra_table(kind, model, tok, like)
    if have:
        old = {k: have['table'][a:a + n] for k, a, n in blocks(have['kind'])}
        for k, a, n in blocks(kind):
            if k in old:
                new[a:a + n] = old[k]
    return dict(kind=kind, table=new)


def extra_targets(kind, marks, size, vc, merge, crop_shapes):
    """Per crop, (n_tok, N_EXTRA[kind]) multi-hot at the token holding each shape's centre: rank, the
    shape's rank by centre x (0 = leftmost; synth keeps centres >= 12 px apart in x); column, the
    crop's patch column holding the centre (the last column for any beyond); ncolour / nshape,
    how many shapes share its colour / shape, less one."""
    n = N_EXTRA[kind]
    shapes = [(x, y, w) for x, y, w in marks if not isinstance(w, str)]
    if kind in ('rank', 'ncolour', 'nshape'):
        xs = sorted(x for x, _, _ in shapes)
        f = {'rank': lambda x, w: xs.index(x),
             'ncolour': lambda x, w: sum(v[1] == w[1] for _, _, v in shapes) - 1,
             'nshape': lambda x, w: sum(v[2] == w[2] for _, _, v in shapes) - 1}[kind]
        return probe.targets([(x, y, f(x, w)) for x, y, w in shapes], size, vc, merge, crop_shapes,
                             lambda k: [k] if k < n else [], n)
    cells = probe.crop_cells([(x, y, None) for x, y, _ in shapes], size, vc, merge, fine=True)
    f = vc.patch * merge
    res = []
    for lst, shp in zip(cells, crop_shapes):
        nx = shp[2] // f
        t = torch.zeros(nx * (shp[1] // f), n)
        for ti, _, (fx, _) in lst:
            t[ti, min(n - 1, (ti % nx) * merge + int(fx * merge))] = 1.0
        res.append(t)
    return res


def pick(extra_t, kind, ci):
    """Crop ci's targets of a (maybe compound) kind from a sample's extra_t (single kind -> per-crop
    list), its parts' columns side by side, as extra_table stacks their rows."""
    return torch.cat([extra_t[k][ci] for k in parts(kind)], 1)


def extra_ce(x, scene_t, extra_t, etab, kind, temp=4.0, weights=None):
    """Cross-entropy of the extra read as logits against its rows, at tokens holding one shape,
    summed over the kind's parts (each part a classification over its own block), part k
    weighted by weights[k] (default 1)."""
    one, _ = single_shape(scene_t)
    if not one.any():
        return x.sum() * 0.0
    loss = 0.0
    for k, a, n in blocks(kind):
        e = etab[a:a + n]
        logits = temp * x[one] @ e.T / e.pow(2).sum(1).mean()
        loss = loss + (weights or {}).get(k, 1.0) * F.cross_entropy(logits, extra_t[one][:, a:a + n].argmax(1))
    return loss


def extra_decode(x, scene_t, extra_t, etab, kind):
    """{part: (tokens holding one shape whose part reads back right (largest score in its block),
    their count)}."""
    one, _ = single_shape(scene_t)
    out = {}
    for k, a, n in blocks(kind):
        if not one.any():
            out[k] = (0, 0)
            continue
        right = (x[one] @ etab[a:a + n].T).argmax(1) == extra_t[one][:, a:a + n].argmax(1)
        out[k] = (int(right.sum()), int(one.sum()))
    return out
