"""Factored token heads: ask the tower for glyph codes shared across places.

Session 8 (scripts/ref/oracle_read.py) found that the language model learns
to read several glyphs a token, in order, within ~3,000 samples when the
image rows code a glyph the same way wherever it sits in the token (row =
sum of glyph vector x place vector), and far slower when every (glyph,
place) pair has its own vector.  The tower's rows are of the second kind:
the sub-probe (probe.sub_loss) has an independent linear head per patch of
the merge block.  These heads decode a token's glyphs through one glyph
matrix G shared by every place or slot, modulated elementwise by a place or
slot vector S:

    logit(glyph g at place/slot k | token x) = sum_d LN(x)_d S_kd G_gd + b_g

so a tower that satisfies them carries a glyph the same way at every place,
the code the language model read fastest.  Two target kinds:

  place  multi-hot over (8x4 places inside the token's cell, glyph), the
         oracle's grid (BCE, summed per glyph);
  slot   the k-th glyph of the token in reading order (lines top to bottom,
         then left to right), or "none" past the last (softmax CE per slot,
         over the tokens holding glyphs).

Training only; nothing of it is exported.
"""
import torch
import torch.nn.functional as F

import probe

GX, GY = 8, 4        # places inside a token's cell (as oracle_read.Oracle)
SLOTS = 8            # glyphs past the 8th of a token are not asked for
NONE = probe.N_GLYPH  # the slot class "no more glyphs"


class FactoredHead(torch.nn.Module):
    def __init__(self, hidden, mode):
        super().__init__()
        if mode not in ('place', 'slot'):
            raise ValueError(f'fprobe mode {mode!r}: place or slot')
        self.mode = mode
        n_k = GX * GY if mode == 'place' else SLOTS
        n_g = probe.N_GLYPH if mode == 'place' else probe.N_GLYPH + 1
        self.glyph = torch.nn.Parameter(torch.randn(n_g, hidden) * hidden ** -0.5)
        self.place = torch.nn.Parameter(1.0 + 0.5 * torch.randn(n_k, hidden))
        self.bias = torch.nn.Parameter(torch.full((n_g,), -6.0 if mode == 'place' else 0.0))

    def forward(self, x):
        """x (T, hidden) -> logits (T, places or slots, glyph classes)."""
        x = F.layer_norm(x, x.shape[-1:])
        return (x[:, None, :] * self.place[None]) @ self.glyph.t() + self.bias


def _line_order(cell):
    """A token's (glyph index, (fx, fy)) in reading order: marks whose centres lie within
    a quarter of the cell height form a line; lines top to bottom, glyphs left to right."""
    cell = sorted(cell, key=lambda m: m[1][1])
    lines = []
    for m in cell:
        if lines and m[1][1] - lines[-1][0][1][1] < 0.25:
            lines[-1].append(m)
        else:
            lines.append([m])
    return [m for ln in lines for m in sorted(ln, key=lambda m: m[1][0])]


def targets(cells, n_tok, mode):
    """cells: one crop's probe.crop_cells(..., fine=True) list of (token, char, (fx, fy)) ->
    place: (n_tok, GX*GY, N_GLYPH) multi-hot;  slot: (n_tok, SLOTS) class indices, -1
    for the tokens holding no glyph (not asked)."""
    per_tok = {}
    for ti, ch, fxy in cells:
        g = ord(ch) - 33 if isinstance(ch, str) and len(ch) == 1 else -1
        if 0 <= g < probe.N_GLYPH:
            per_tok.setdefault(ti, []).append((g, fxy))
    if mode == 'place':
        t = torch.zeros(n_tok, GX * GY, probe.N_GLYPH)
        for ti, lst in per_tok.items():
            for g, (fx, fy) in lst:
                t[ti, min(GY - 1, int(fy * GY)) * GX + min(GX - 1, int(fx * GX)), g] = 1.0
        return t
    t = torch.full((n_tok, SLOTS), -1, dtype=torch.long)
    for ti, lst in per_tok.items():
        order = [g for g, _ in _line_order(lst)][:SLOTS]
        t[ti] = NONE
        t[ti, :len(order)] = torch.tensor(order)
    return t


def loss(head, rows, tgt):
    """rows (T, hidden) and targets for them (targets()) -> scalar loss, or None if the
    rows hold no glyph."""
    if head.mode == 'place':
        n = tgt.sum()
        if n == 0:
            return None
        return F.binary_cross_entropy_with_logits(head(rows), tgt, reduction='sum') / n
    keep = tgt[:, 0] >= 0
    if not keep.any():
        return None
    lo = head(rows[keep])
    return F.cross_entropy(lo.reshape(-1, lo.shape[-1]), tgt[keep].reshape(-1))


def cell_targets(cells, crop_shapes, vc, merge, mode):
    """probe.crop_cells(..., fine=True) of a sample -> targets() per crop."""
    f = vc.patch * merge
    return [targets(c, (shp[1] // f) * (shp[2] // f), mode) for c, shp in zip(cells, crop_shapes)]


def crop_targets(marks, size, vc, merge, crop_shapes, mode):
    """synth marks of a sample -> targets() per crop (train.py's sq['fprobe'])."""
    return cell_targets(probe.crop_cells(marks, size, vc, merge, fine=True), crop_shapes, vc, merge, mode)


def batch_loss(head, feats, seqs):
    """loss() over every crop of the batch whose sample has targets (sq['fprobe']);
    feats[(sample, crop)] are the tower's output rows."""
    keys = [(si, ci) for si, sq in enumerate(seqs) if sq.get('fprobe') is not None
            for ci in range(len(sq['fprobe']))]
    if not keys:
        return None
    return loss(head, torch.cat([feats[k] for k in keys]),
                torch.cat([seqs[si]['fprobe'][ci] for si, ci in keys]))
