#!/usr/bin/python3
"""Vision parity against the C tower (scripts/mcv-vision-dump.c).

    dump_vision.py embd TEXT.gguf MMPROJ.gguf IMAGE C_PLAN.json C_EMBD.f32
                   [--merge 4|2] [--max-slices N] [--upscale F] [--tol T] [--rel] [--quant C2.f32 [--qtol Q]]
        runs the reference (export.load: the GGUF's dequantized weights) on the
        image's crops, checks the C plan (sizes, grid, token counts) is the
        same and prints the max abs diff of the visual embeddings; exit 1 when
        the plan differs or the diff is over the tolerance (--rel: T times the
        largest |reference| value).  --quant checks a second output (mcv's
        quantized kernels, activations rounded to the weight's dot type as
        llama.cpp does) against Q times the largest |reference| value.
    dump_vision.py chat TEXT.gguf MMPROJ.gguf IMAGE PROMPT N [--merge M] [--max-slices N]
                   [--check MCV.json [--eps E] [--logits MCV.f32 [--ltol L]]]
                   [--image FILE]... [--frame FILE]...
        greedy ids of the chat prompt with the image (chatfmt layout), as
        {"ids": [...], "next_pos": P} -- what mcv-vision-dump --model prints.
        --check: feed mcv's ids to the reference instead (teacher forcing) and
        fail unless each is the reference's argmax or within E of its logit
        (random models have near-ties), and the next positions agree.
        --logits: mcv's logits after the prompt (mcv-vision-dump --logits)
        must also be within L (default 0.05) times max|reference logit|.
        Several media in one prompt: --image FILE (another still) and --frame
        FILE (a video frame) add to IMAGE in command-line order (IMAGE "-":
        none).  Layout, as mcv-run places them (mtmd differs: no ids): every
        block follows the previous one on the canvas (positions keep
        advancing: a crop by max(nx, ny), a text token by one); a frame is
        its overview only, without an id; with two or more stills each still
        is prefixed "<image_id>k</image_id>" (k counts stills from 0).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import chatfmt   # noqa: E402
import export   # noqa: E402
from model import image_positions, image_to_crops, scaled_size, slice_plan, text_positions   # noqa: E402


def load(a):
    m = export.load(a.text, a.mmproj)
    m.eval()
    if a.max_slices:
        m.vc.max_slices = a.max_slices
    return m


@torch.no_grad()
def embd(a):
    from PIL import Image
    m = load(a)
    merge = a.merge or m.vc.merge
    img = Image.open(a.image).convert('RGB')
    crops, grid = image_to_crops(img, m.vc, merge, a.upscale)
    ov, grid2, refined = slice_plan(*scaled_size(img.width, img.height, a.upscale), m.vc, merge)
    plan = json.load(open(a.plan))
    want = dict(overview=list(ov), grid=list(grid) if grid else [0, 0],
                refined=list(refined) if refined else [0, 0],
                crops=[[c.shape[2], c.shape[1]] for c in crops])
    got = dict(overview=plan['overview'], grid=plan['grid'], refined=plan['refined'],
               crops=[c[:2] for c in plan['crops']])
    if want != got:
        print(f'plan differs: reference {want} mcv {got}')
        return 1
    outs = []
    for c in crops:
        f, (nx, ny) = m.vision(c[None], merge)
        outs.append(f[0])
    ref = torch.cat(outs, 0).numpy()
    scale = float(np.abs(ref).max())
    bad = 0
    for path, tol, what in ((a.embd, a.tol * scale if a.rel else a.tol, 'exact' if not a.rel else ''),
                            (a.quant, a.qtol * scale, 'quantized')):
        if not path:
            continue
        mine = np.fromfile(path, dtype=np.float32)
        if mine.size != ref.size:
            print(f'size differs: reference {ref.shape} mcv {mine.size} floats')
            return 1
        mine = mine.reshape(ref.shape)
        d = float(np.abs(mine - ref).max())
        ok = d <= tol and bool(np.isfinite(mine).all())
        bad += not ok
        print(f'{os.path.basename(a.image)} merge {merge} grid {want["grid"]} crops {len(crops)} '
              f'tokens {ref.shape[0]} {what}: max|diff| {d:.3g} (max|ref| {scale:.3g}, '
              f'tolerance {tol:.3g}) {"ok" if ok else "FAIL"}')
    return 1 if bad else 0


def encode_multi(tok, media, prompt, vc, merge=None):
    """chatfmt.encode_sample for several media [(PIL image, is_frame)]: the
    same dict (ids with -1 at visual rows, pos, crops, img_spans, next_pos)."""
    merge = merge or vc.merge
    ids, pos, spans, crops = [], [], [], []
    p = 0

    def add_text(text):
        nonlocal p
        t = tok.encode(text)
        ids.extend(t)
        pos.append(text_positions(len(t), p))
        p += len(t)

    def add_crop(crop):
        nonlocal p
        nx, ny = chatfmt.crop_tokens(crop.shape, vc, merge)
        spans.append((len(ids), len(crops)))
        crops.append(crop)
        ids.extend([-1] * (nx * ny))
        pp, adv = image_positions(p, nx, ny)
        pos.append(pp)
        p += adv

    n_still = sum(1 for _, fr in media if not fr)
    still = 0
    add_text("<|im_start|>user\n")
    for img, frame in media:
        cs, grid = image_to_crops(img, vc, merge)
        if frame:
            grid = None     # a frame is its overview only
        elif n_still > 1:
            add_text(f"<image_id>{still}</image_id>")
            still += 1
        add_text("<image>")
        add_crop(cs[0])
        add_text("</image>")
        if grid is not None:
            cols, rows = grid
            for r in range(rows):
                for c in range(cols):
                    add_text("<slice>")
                    add_crop(cs[1 + r * cols + c])
                    add_text("</slice>")
                if r != rows - 1:
                    add_text("\n")
        add_text("\n")
    add_text(prompt + "<|im_end|>\n<|im_start|>assistant\n" + chatfmt.THINK_OFF)
    return dict(ids=ids, pos=torch.cat(pos, 0), crops=crops, img_spans=spans, next_pos=p, merge=merge)


class _Media(argparse.Action):
    """--image / --frame append (path, is_frame) to one ordered list."""
    def __call__(self, parser, ns, value, option_string=None):
        lst = getattr(ns, 'media', None) or []
        lst.append((value, option_string == '--frame'))
        ns.media = lst


@torch.no_grad()
def chat(a):
    from PIL import Image
    m = load(a)
    import dump
    tok = dump.tokenizer_from_gguf(a.text)
    if a.media or a.image == '-':
        media = ([] if a.image == '-' else [(a.image, False)]) + (a.media or [])
        sq = encode_multi(tok, [(Image.open(f).convert('RGB'), fr) for f, fr in media], a.prompt, m.vc, a.merge)
    else:
        s = dict(prompt=a.prompt, image=Image.open(a.image), answer=None)
        sq = chatfmt.encode_sample(tok, s, m.vc, a.merge)
    ids = torch.tensor(sq['ids'])
    e = m.text.embed[ids.clamp_min(0)]
    parts, last = [], 0
    for start, ci in sq['img_spans']:
        f, _ = m.vision(sq['crops'][ci][None], sq['merge'])
        parts += [e[last:start], f[0]]
        last = start + f.shape[1]
    parts.append(e[last:])
    e = torch.cat(parts, 0)[None]
    caches = m.text.new_caches()
    h = m.text(e, sq['pos'][None], caches, 'chunked')
    lg = m.text.logits(h[:, -1])[0]
    p, out, end = sq['next_pos'], [], tok.id('<|im_end|>')
    if a.check:
        # teacher-forced on mcv's tokens: each must be the reference's argmax,
        # or within --eps of its logit (a near-tie that float rounding may flip)
        got = json.load(open(a.check))
        lok = True
        if a.logits:
            # the prompt's logits: tighter than greedy agreement, so that a
            # block out of place (e.g. frames out of order) is seen
            mine = torch.from_numpy(np.fromfile(a.logits, dtype=np.float32))
            d = float((mine - lg).abs().max()) if mine.numel() == lg.numel() else float('inf')
            lok = d <= a.ltol * float(lg.abs().max())
            print(f'prompt logits: max|diff| {d:.3g} (max|ref| {float(lg.abs().max()):.3g}, tolerance '
                  f'{a.ltol} of it) {"ok" if lok else "FAIL"}')
        same, bad = 0, []
        for i, t in enumerate(got['ids']):
            mx = float(lg.max())
            same += int(int(lg.argmax()) == t)
            if float(lg[t]) < mx - a.eps:
                bad.append((i, t, int(lg.argmax()), mx - float(lg[t])))
            h = m.text(m.text.embed[torch.tensor([[t]])], text_positions(1, p)[None], caches, 'recurrent')
            p += 1
            lg = m.text.logits(h[:, -1])[0]
        posok = got['next_pos'] == p
        ok = not bad and posok and len(got['ids']) > 0 and lok
        print(f'{os.path.basename(a.image)} merge {sq["merge"]}: {same}/{len(got["ids"])} tokens are the '
              f'reference argmax, {len(bad)} off by more than {a.eps} {bad[:3]}; next position mcv '
              f'{got["next_pos"]} reference {p} {"ok" if ok else "FAIL"}')
        return 0 if ok else 1
    for _ in range(a.n):
        nxt = int(lg.argmax())
        if nxt == end:
            break
        out.append(nxt)
        h = m.text(m.text.embed[torch.tensor([[nxt]])], text_positions(1, p)[None], caches, 'recurrent')
        p += 1
        lg = m.text.logits(h[:, -1])[0]
    print(json.dumps(dict(ids=out, next_pos=p)))
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest='cmd', required=True)
    for name in ('embd', 'chat'):
        s = sub.add_parser(name)
        s.add_argument('text')
        s.add_argument('mmproj')
        s.add_argument('image')
        if name == 'embd':
            s.add_argument('plan')
            s.add_argument('embd')
            s.add_argument('--tol', type=float, default=1e-4)
            s.add_argument('--rel', action='store_true')
            s.add_argument('--quant', help='a second mcv output (quantized kernels) checked with --qtol')
            s.add_argument('--qtol', type=float, default=0.05, help='relative to max|reference|')
            s.add_argument('--upscale', type=float, default=1.0, help='slices planned as for the image scaled by it')
        else:
            s.add_argument('prompt')
            s.add_argument('n', type=int)
            s.add_argument('--check', help="mcv-vision-dump --model output (JSON) to verify teacher-forced")
            s.add_argument('--eps', type=float, default=0.05)
            s.add_argument('--logits', help='with --check: mcv\'s logits after the prompt (float32) to compare')
            s.add_argument('--ltol', type=float, default=0.05, help='--logits tolerance, relative to max|reference|')
            s.add_argument('--image', dest='media', action=_Media, metavar='FILE',
                           help='another still image in the prompt')
            s.add_argument('--frame', dest='media', action=_Media, metavar='FILE',
                           help='a video frame in the prompt (overview only)')
        s.add_argument('--merge', type=int, default=None)
        s.add_argument('--max-slices', type=int, default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sys.exit(embd(a) if a.cmd == 'embd' else chat(a))


if __name__ == '__main__':
    main()
