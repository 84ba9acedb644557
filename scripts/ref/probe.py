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

N_GLYPH = 94          # printable ASCII 33..126, the first labels of synth.MARK_LABELS


def crop_cells(marks, size, vc, merge, sub=False, fine=False):
    """marks [(x, y, what)] in image pixels, image size (W, H) -> per crop (overview first, then
    tiles row-major, as model.image_to_crops), a list of (token index, what); token grids as
    chatfmt.crop_tokens (cells of patch*merge crop pixels).  sub: (token index, what, s) with s
    the patch inside the token's merge x merge block, row-major.  fine: (token index, what,
    (fx, fy)) with fx, fy in [0, 1) the mark's place inside its cell."""
    W, H = size
    f = vc.patch * merge
    ov, grid, refined = slice_plan(W, H, vc, merge)
    out = []

    def put(lst, x, y, cw, ch, what):
        nx, ny = cw // f, ch // f
        cx, cy = int(x // f), int(y // f)
        if 0 <= cx < nx and 0 <= cy < ny:
            if fine:
                lst.append((cy * nx + cx, what, ((x - cx * f) / f, (y - cy * f) / f)))
            elif sub:
                sx = min(merge - 1, int((x - cx * f) // vc.patch))
                sy = min(merge - 1, int((y - cy * f) // vc.patch))
                lst.append((cy * nx + cx, what, sy * merge + sx))
            else:
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


# Shapes by name.  The probe's BCE over every label taught colour and size
# (0.98 at the shape's token) but left shapes at 0.62-0.65: hexagons and
# circles called squares, so captions named the wrong shapes (session 9).
# A softmax over the shape labels alone, at the token holding the shape's
# centre, is a direct signal: tower-only, 0.62 -> 0.79 in 1,600 scene samples.


def shape_targets(marks, size, vc, merge, shapes, radius=None):
    """synth marks -> per crop [(token index, shape class)] for the scene marks
    (what = (kind, colour, shape, size)); shapes: the class names in order.
    radius {size class: pixels}: every token the shape covers, not only its centre's,
    taken as the tokens of nine points of the disk of that radius (centre, and at
    0.7 r in eight directions): colour is in all of a shape's tokens, so the language
    model's attention finds the object anywhere on it, and the shape should be there too."""
    if radius is None:
        return [[(ti, shapes.index(what[2])) for ti, what in lst if not isinstance(what, str)]
                for lst in crop_cells(marks, size, vc, merge)]
    pts = []
    for x, y, what in marks:
        if isinstance(what, str):
            continue
        r = 0.7 * radius[what[3]]
        for dx, dy in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1), (.7, .7), (-.7, .7), (.7, -.7), (-.7, -.7)):
            pts.append((x + dx * r, y + dy * r, shapes.index(what[2])))
    return [sorted(set(lst)) for lst in crop_cells(pts, size, vc, merge)]


def shape_loss(head, feats, seqs, label_ids):
    """Mean cross-entropy over the shape classes (the probe head's logits at label_ids)
    at every shape's token; seqs[i]['shapes'] holds shape_targets of sample i (or None)."""
    xs, ys = [], []
    for si, sq in enumerate(seqs):
        for ci, lst in enumerate(sq.get('shapes') or ()):
            for ti, y in lst:
                xs.append(feats[(si, ci)][ti])
                ys.append(y)
    if not xs:
        return None
    x = torch.stack(xs)
    x = F.layer_norm(x, x.shape[-1:])
    return F.cross_entropy(head(x)[:, label_ids], torch.tensor(ys))


# Where a token is.  Shapes are captioned "from left to right" and text is
# read in order, yet the language model orders image tokens by column near
# chance (session 9): positions reach it only through 2 of the 8 rotary pairs
# of its 2 attention layers, and a token's column is only partly in its
# content (linear R^2 0.62 at 16x, 0.68 at 4x; row 0.28 / 0.40).  This head
# asks the tower to keep each token's place in its crop linearly readable,
# (column, row) scaled to [-1, 1], so a key can carry "how far left" as a
# plain feature the reading heads can score.


def pos_loss(head, feats, seqs, patch=14):
    """Mean squared error of head(LN(row)) against each token's (column, row) in its crop,
    scaled to [-1, 1], over every crop of every sample."""
    xs, ts = [], []
    for si, sq in enumerate(seqs):
        for ci, c in enumerate(sq['crops']):
            f = patch * sq['merge']
            nx, ny = c.shape[2] // f, c.shape[1] // f
            col = torch.arange(nx).repeat(ny).float()
            row = torch.arange(ny).repeat_interleave(nx).float()
            ts.append(torch.stack([2 * col / max(1, nx - 1) - 1, 2 * row / max(1, ny - 1) - 1], 1))
            xs.append(feats[(si, ci)])
    if not xs:
        return None
    x = torch.cat(xs)
    x = F.layer_norm(x, x.shape[-1:])
    return F.mse_loss(head(x), torch.cat(ts))


# Where in a token each glyph is.  A bag of glyphs per token does not say their
# order, and reading needs it: at 4x a token holds a 2x2 block of patches, at
# 16x a 4x4 one, and the sub-probe asks the token which glyphs sit in each of
# those patches (multi-hot: a 14-pixel patch holds one or two glyphs).


def sub_targets(marks, size, vc, merge, crop_shapes):
    """-> list of (n_tok, merge*merge*N_GLYPH) float targets, one per crop."""
    cells = crop_cells(marks, size, vc, merge, sub=True)
    f = vc.patch * merge
    res = []
    for lst, shp in zip(cells, crop_shapes):
        t = torch.zeros((shp[1] // f) * (shp[2] // f), merge * merge * N_GLYPH)
        for ti, what, si in lst:
            if isinstance(what, str) and 33 <= ord(what) <= 126:
                t[ti, si * N_GLYPH + ord(what) - 33] = 1.0
        res.append(t)
    return res


class SubHeads(torch.nn.Module):
    """One linear head per merge factor (2: 4x, 4: 16x) on the layer-normalised token."""

    def __init__(self, hidden):
        super().__init__()
        self.heads = torch.nn.ModuleDict({str(m): torch.nn.Linear(hidden, m * m * N_GLYPH) for m in (2, 4)})
        with torch.no_grad():
            for h in self.heads.values():
                h.bias.fill_(-5.0)


def sub_loss(sub, feats, seqs):
    """Summed per-label BCE per token, averaged over the tokens of every crop with targets."""
    total, n = None, 0
    for si, sq in enumerate(seqs):
        tg = sq.get('probe_sub')
        if tg is None:
            continue
        head = sub.heads[str(sq['merge'])]
        for ci, t in enumerate(tg):
            x = feats[(si, ci)]
            x = F.layer_norm(x, x.shape[-1:])
            l = F.binary_cross_entropy_with_logits(head(x), t, reduction='sum')
            total = l if total is None else total + l
            n += x.shape[0]
    return None if total is None else total / n


# Patch-level glyphs on dense text crops (synth.dense_text, train.py --dense): the
# glyphs whose centre falls in each 14-px patch of the tower's unmerged rows
# (model.VisionModel.patch_rows).  Dense crops carry ~100 glyphs where a scene
# carries none, and the head sits before any merging, so this teaches the
# tower to name glyphs at every offset in a patch several times faster than the
# token-level heads above (0.30 -> 0.51 recall in 5,400 crops, session 7).


def patch_targets(marks, side=224, patch=14, tol=0.0):
    """marks [(x, y, char)] in crop pixels -> (n_patch, N_GLYPH) multi-hot, patches row-major.
    tol > 0: a glyph whose centre lies within tol pixels of an edge its patch shares with a
    neighbour is "don't care" (-1) for that neighbour, unless the neighbour holds the same
    glyph itself.  Which side of an edge a glyph's centre falls on is decided by a pixel or
    two of rendering and resizing; at the centre rule's edges recall is 0.4-0.6 against
    0.8-0.9 for centred glyphs (session 9), so the hard rule teaches the tower a boundary
    nobody reads instead of the glyph.  The loss skips -1 entries (patch_loss)."""
    n = side // patch
    t = torch.zeros(n * n, N_GLYPH)
    near = []
    for x, y, ch in marks:
        cx, cy = int(x // patch), int(y // patch)
        if 0 <= cx < n and 0 <= cy < n and 33 <= ord(ch) <= 126:
            g = ord(ch) - 33
            t[cy * n + cx, g] = 1.0
            if tol > 0:
                fx, fy = x - cx * patch, y - cy * patch
                for dx, dy, close in ((-1, 0, fx < tol), (1, 0, patch - fx < tol),
                                      (0, -1, fy < tol), (0, 1, patch - fy < tol)):
                    if close and 0 <= cx + dx < n and 0 <= cy + dy < n:
                        near.append(((cy + dy) * n + cx + dx, g))
    for p, g in near:
        if t[p, g] == 0:
            t[p, g] = -1.0
    return t


def new_patch_head(width):
    """The patch-level glyph head, starting at the labels' prior (zero weights, logit -4)."""
    head = torch.nn.Linear(width, N_GLYPH)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-4.0)
    return head


def patch_loss(head, rows, targets):
    """Summed per-label BCE per glyph (not per patch: most patches of a page still
    hold one or two glyphs, and a per-glyph mean does not change with line spacing).
    Entries of -1 (patch_targets' tol) do not count."""
    lo = head(rows.reshape(-1, rows.shape[-1]))
    t = targets.reshape(-1, targets.shape[-1])
    care = (t >= 0).float()
    pos = (t > 0).float()
    return (F.binary_cross_entropy_with_logits(lo, pos, weight=care, reduction='sum')
            / pos.sum().clamp_min(1.0))


def patch_recall(head, rows, targets):
    """Of the patches holding k >= 1 glyphs, the share of those glyphs among the head's k
    most likely: (hits, glyphs).  Don't-care entries (-1) count as neither."""
    lo = head(rows.reshape(-1, rows.shape[-1]))
    t = (targets.reshape(-1, targets.shape[-1]) > 0).float()
    hits = n = 0
    for p in torch.nonzero(t.sum(-1)).flatten().tolist():
        k = int(t[p].sum())
        hits += int(t[p][lo[p].topk(k).indices].sum())
        n += k
    return hits, n


def patch_recall_over(head, rows_of, px, targets, batch=8):
    """patch_recall over crops px (n, 3, h, w) with targets (n, n_patch, N_GLYPH), rows_of(px
    batch) giving the rows, in batches and without gradients: (hits, glyphs)."""
    hits = n = 0
    with torch.no_grad():
        for i in range(0, len(px), batch):
            h, k = patch_recall(head, rows_of(px[i:i + batch]), targets[i:i + batch])
            hits, n = hits + h, n + k
    return hits, n


def load_with_heads(path, who):
    """A training checkpoint -> (its dict, the model, the probe head, the glyph-position
    heads or None); exits with a one-line error (prefixed who) if it has no probe head."""
    import compact
    from model import MiniCPMV
    import synth
    d = compact.load(path)   # a compact checkpoint too
    if 'probe' not in d:
        raise SystemExit(f'{who}: {path} has no probe head (train with --probe)')
    model = MiniCPMV.from_config(d['config'])
    model.load_state_dict(d['model'])
    head = torch.nn.Linear(model.tc.hidden, len(synth.MARK_LABELS))
    head.load_state_dict(d['probe'])
    sub = None
    if 'probe_sub' in d:
        sub = SubHeads(model.tc.hidden)
        sub.load_state_dict(d['probe_sub'])
    return d, model, head, sub


def common_share(feats):
    """feats: {(sample, crop): (n, H) image embeddings} -> the share of their mean energy that
    lies in the vector common to all of them, |mean|^2 / mean |row|^2 (0: no common part,
    1: every token the same).  The projector of a fresh tower gives ~0.92, so to the
    language model every image token looks nearly alike (session 10)."""
    f = torch.cat(list(feats.values()))
    return f.mean(0).pow(2).sum() / f.pow(2).sum(1).mean().clamp_min(1e-12)
