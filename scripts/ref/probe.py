"""Dense auxiliary targets for the vision tower (training only; nothing of it is exported).

The language-model loss reaches the vision tower only through the answer
tokens, a weak signal for a tower trained from scratch: after ~36k samples the
proving model still called every shape "small" and most of them "hexagon".
The synthetic images know what is where (synth.sample(..., marks=[...]):
glyph centres of receipts and screenshots, shape centres with colour, shape
and size of scenes), so every output token of every crop gets a multi-hot
target over synth.MARK_LABELS: the labels of the marks whose centre falls in
that token's cell.  A linear probe from the token (the projector output, what
the language model reads) to those labels adds a BCE loss, which teaches the
tower to put glyph identity and shape attributes into the right tokens.
"""
import torch
import torch.nn.functional as F

from model import slice_plan


def crop_cells(marks, size, vc, merge):
    """marks [(x, y, what)] in image pixels, image size (W, H) -> per crop (overview first, then
    tiles row-major, as model.image_to_crops), a list of (token index, what); token grids as
    chatfmt.crop_tokens (cells of patch*merge crop pixels)."""
    W, H = size
    f = vc.patch * merge
    ov, grid, refined = slice_plan(W, H, vc, merge)
    out = []

    def put(lst, x, y, cw, ch, what):
        nx, ny = cw // f, ch // f
        cx, cy = int(x // f), int(y // f)
        if 0 <= cx < nx and 0 <= cy < ny:
            lst.append((cy * nx + cx, what))

    lst = []
    for x, y, what in marks:
        put(lst, x * ov[0] / W, y * ov[1] / H, ov[0], ov[1], what)
    out.append(lst)
    if grid is not None:
        gc, gr = grid
        tw, th = refined[0] // gc, refined[1] // gr
        tiles = [[] for _ in range(gc * gr)]
        for x, y, what in marks:
            xr, yr = x * refined[0] / W, y * refined[1] / H
            c, r = int(xr // tw), int(yr // th)
            if 0 <= c < gc and 0 <= r < gr:
                put(tiles[r * gc + c], xr - c * tw, yr - r * th, tw, th, what)
        out.extend(tiles)
    return out


def targets(marks, size, vc, merge, crop_shapes, label_fn, n_labels):
    """-> list of (n_tok, n_labels) float targets, one per crop."""
    cells = crop_cells(marks, size, vc, merge)
    assert len(cells) == len(crop_shapes)
    f = vc.patch * merge
    res = []
    for lst, shp in zip(cells, crop_shapes):
        n = (shp[1] // f) * (shp[2] // f)
        t = torch.zeros(n, n_labels)
        for ti, what in lst:
            for li in label_fn(what):
                t[ti, li] = 1.0
        res.append(t)
    return res


def loss(head, feats, seqs):
    """Mean over the crops' tokens of the summed per-label BCE; seqs[i]['probe'] holds the
    targets of sample i (or None), feats[(i, crop)] the tower's output rows."""
    xs, ts = [], []
    for si, sq in enumerate(seqs):
        tg = sq.get('probe')
        if tg is None:
            continue
        for ci, t in enumerate(tg):
            xs.append(feats[(si, ci)])
            ts.append(t)
    if not xs:
        return None
    x, t = torch.cat(xs), torch.cat(ts)
    # the projector's rows run to |x| ~ 100: normalise them, or the probe's first steps
    # produce logits in the hundreds and its gradient drowns the language loss
    x = F.layer_norm(x, x.shape[-1:])
    return F.binary_cross_entropy_with_logits(head(x), t, reduction='sum') / x.shape[0]
