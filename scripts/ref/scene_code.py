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
import torch
import torch.nn.functional as F

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
