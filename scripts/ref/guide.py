"""Guided reading attention (training only; nothing of it is exported).

scripts/ref/oracle_read.py showed the language model, not the tower, holds
reading back: from perfect glyph rows it learns a single glyph in ~1,000
samples but not five in a row in 8,000.  What it lacks is where to look
next.  The synthetic images know it: the answer's characters are the marks,
in order, and each mark sits in known image tokens.  So one head of each
full-attention layer gets a loss pulling its attention at every answer
position onto the tokens holding

  - the first glyph of the token it reads (the first attention layer:
    "find what I just wrote"), and
  - the first glyph of the token it is about to write (the last one:
    "look at what comes next"),

-log(attention mass on those tokens), averaged over the positions that have
such a glyph.  The other heads stay free.
"""
import torch

import probe


def targets(tok, sq, marks, vc, merge, size):
    """-> (cur, nxt): lists of (position t, [sequence positions]) for an encoded
    sample (chatfmt.encode_sample) and its synth marks: the image tokens holding
    the first glyph of ids[t] (cur) and of ids[t + 1] (nxt), answer positions only.
    Marks are the answer's non-space characters in order (synth.text_marks)."""
    labels = sq['labels']
    cells = probe.crop_cells([(x, y, i) for i, (x, y, _) in enumerate(marks)], size, vc, merge)
    where = {}
    for (start, ci), lst in zip(sq['img_spans'], cells):
        for ti, mi in lst:
            where.setdefault(mi, []).append(start + ti)
    glyph_of = {}          # sequence position -> mark index of its token's first glyph
    n = 0                  # non-space characters of the answer before this token
    for t, lab in enumerate(labels):
        if lab < 0:
            continue
        piece = tok.decode([lab], special=False)
        for ch in piece:
            if not ch.isspace():
                if t not in glyph_of and n < len(marks):
                    glyph_of[t] = n
                n += 1
    cur = [(t, where[m]) for t, m in glyph_of.items() if m in where]
    nxt = [(t - 1, where[m]) for t, m in glyph_of.items() if m in where and t > 0]
    return cur, nxt


def attention_layers(model):
    return [b.mix for b in model.text.blocks if not b.recurrent]


def keep(model, on=True):
    for a in attention_layers(model):
        a.keep_att = on
        if not on:
            a.last_att = None


def loss(model, all_targets, head=0):
    """Mean -log attention mass over the batch's targets (one (cur, nxt) per sample),
    from the last forward's kept attention; 0 when there is none."""
    layers = attention_layers(model)
    first, last = layers[0].last_att, layers[-1].last_att
    terms = []
    for b, (cur, nxt) in enumerate(all_targets):
        for att, tg in ((first, cur), (last, nxt)):
            for t, pos in tg:
                terms.append(att[b, head, t, pos].sum().float().clamp_min(1e-6).log())
    if not terms:
        return first.new_zeros(())
    return -torch.stack(terms).mean()
