"""A fixed code for what a text image's tokens should say: each glyph's own embedding, bound to its place.

scene_code.py gave scenes a code fixed in advance (the language model's own
words), so the tower could be taught to write it without the language model
in the loop (tower_code.py); scenes went from 0.01 to 0.49 exact captions.
This is the same for reading:

  token row = scale * sum over the glyphs whose centre lies in the token's cell
              of  E[glyph] * P[place],

E[glyph] the language model's input embedding of the glyph's own byte token
(every printable ASCII character is one token), P[place] fixed random signs
(+1/-1, seed 1) for the glyph's place on a GX x GY grid inside the cell (the
grid of oracle_read.py's oracle).  Session 8 found the language model reads
words in order within ~3,000 samples from glyph vector x place vector codes
(oracle_read.py --factored) and not from one vector per (glyph, place): what
it learns about a glyph must carry across places.  A sign flip per place is a
diagonal linear map, so the reader undoes it with the linear layers it has.

A glyph is read back at its place p by (row * P[p]) . E[g] over the 94
glyphs: the other glyphs of the token enter as noise of ~1/sqrt(hidden) each.

Text crops only where the image has tiles: the overview of a receipt or
screenshot is downscaled below legibility, so its tokens get no target.
"""
import argparse

import torch
import torch.nn.functional as F

N_GLYPH = 94          # printable ASCII 33..126 (probe.N_GLYPH)
GX, GY = 8, 4         # places inside a token's cell


def tables(model, tok, scale=1.0, seed=1, bind=1.0):
    """(E (N_GLYPH, hidden): the embedding of each glyph's token times scale,
    P (GX*GY, hidden): the places' vectors, (1 - bind) + bind x fixed random signs).

    bind 1 binds a glyph to its place by signs alone (session 12's code); bind 0 drops
    the place (a token's row is the bag of its glyphs); 0.5 makes each place a random
    0/1 mask over the hidden units.  session 8's learnt factored oracle, which the
    language model read in ~3k samples, started its place vectors at 1 + 0.5 x noise:
    mostly the bag, the place a modulation."""
    if not 0.0 <= bind <= 1.0:
        raise ValueError(f'glyph_code: bind {bind}: want 0..1')
    emb = model.text.embed.detach()
    ids = []
    for c in range(33, 127):
        t = tok.encode(chr(c))
        if len(t) != 1:
            raise ValueError(f'glyph_code: {chr(c)!r} is {len(t)} tokens, want 1')
        ids.append(t[0])
    g = torch.Generator().manual_seed(seed)
    P = (1.0 - bind) + bind * (torch.randint(0, 2, (GX * GY, emb.shape[1]), generator=g).float() * 2 - 1)
    return emb[torch.tensor(ids)].clone() * scale, P


def bind_arg(s):
    """argparse type of a binding strength (tower_code.py --glyph-bind, oracle_read.py --bind): a float in 0..1."""
    try:
        w = float(s)
    except ValueError:
        w = -1.0
    if not 0.0 <= w <= 1.0:
        raise argparse.ArgumentTypeError(f'{s!r}: want a number from 0 to 1')
    return w


def targets(cells, n_tok, slots=False):
    """probe.crop_cells(fine=True)'s [(token, char, (fx, fy))] of one crop ->
    (token ids, glyph ids, place ids) as long tensors, glyphs outside ASCII 33..126 dropped.

    slots: a glyph's place is its rank in reading order among its token's glyphs (upper
    half of the cell before lower, then left to right) instead of where in the cell it
    sits.  A bag of glyphs (bind 0) loses their order inside a token, and at 4x 0.83 of a
    receipt's digits share a token with another digit (session 26); a slot says which
    comes first with a handful of places where the cell's grid has 32."""
    kept = [(ti, ord(ch) - 33, fx, fy) for ti, ch, (fx, fy) in cells if 0 <= ord(ch) - 33 < N_GLYPH and ti < n_tok]
    pl = [min(GY - 1, int(fy * GY)) * GX + min(GX - 1, int(fx * GX)) for _, _, fx, fy in kept]
    if slots:
        by_token = {}
        for i, (ti, _, fx, fy) in enumerate(kept):
            by_token.setdefault(ti, []).append((int(fy * 2), fx, i))
        for lst in by_token.values():
            for rank, (_, _, i) in enumerate(sorted(lst)):
                pl[i] = min(rank, GX * GY - 1)
    return (torch.tensor([k[0] for k in kept], dtype=torch.long), torch.tensor([k[1] for k in kept], dtype=torch.long),
            torch.tensor(pl, dtype=torch.long))


def stored(d):
    """(E, P, slots) of a checkpoint's glyph code (None if it has none); codes saved before
    session 27 carry no slots flag and place glyphs on the cell grid."""
    g = d.get('glyph_code')
    if g is None:
        return None
    return g['E'], g['P'], bool(g.get('slots', False))


def store(E, P, slots):
    """The checkpoint entry of a glyph code (every value a tensor, so compact.py packs it)."""
    return dict(E=E, P=P, slots=torch.tensor(bool(slots)))


def rows(tg, E, P, n_tok):
    """The code's rows (n_tok, hidden) of one crop's targets."""
    tk, gl, pl = tg
    out = E.new_zeros(n_tok, E.shape[1])
    return out.index_add(0, tk, E[gl] * P[pl]) if len(tk) else out


def logits(x, tg, E, P, temp=4.0):
    """(n_glyph, N_GLYPH): each glyph's token row read back at its place."""
    tk, _, pl = tg
    return temp * (x[tk] * P[pl]) @ E.T / E.pow(2).sum(1).mean()


def ce(x, tg, E, P, temp=4.0):
    """Cross-entropy of the glyphs read back at their places (0 if the crop has none)."""
    if not len(tg[0]):
        return x.sum() * 0.0
    return F.cross_entropy(logits(x, tg, E, P, temp), tg[1])


def decode(x, tg, E, P):
    """(glyphs read right at their place, glyphs), (sum of squares of empty tokens' rows, their count x hidden)."""
    tk, gl, _ = tg
    right = int((logits(x, tg, E, P).argmax(1) == gl).sum()) if len(tk) else 0
    empty = torch.ones(x.shape[0], dtype=torch.bool)
    empty[tk] = False
    return (right, len(tk)), (float(x[empty].pow(2).sum()), int(empty.sum()) * x.shape[1])
