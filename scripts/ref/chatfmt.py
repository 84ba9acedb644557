#!/usr/bin/python3
"""Chat template and image block of the proving model, laid out as llama.cpp mtmd does.

    <|im_start|>user\\n{image block}{prompt}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n{answer}<|im_end|>

image block (minicpmv 2.6 slice template, overview first):
    <image>[overview]</image><slice>[tile]</slice><slice>[tile]</slice>\\n<slice>...</slice>  then "\\n"
Every image chunk (overview, each tile) gets M-RoPE positions t=p0, h=p0+row, w=p0+col and
advances the position by max(nx, ny); text tokens advance it by one.
"""
import torch

import synth
from model import image_to_crops, image_positions, text_positions

THINK_OFF = "<think>\n\n</think>\n\n"


def crop_tokens(shape, vc, merge):
    """(3,h,w) crop -> (nx, ny) output token grid."""
    _, h, w = shape
    f = vc.patch * merge
    return w // f, h // f


def spelled(tok, text):
    """text as one token per character (a character outside the byte tokens' one-token set, as
    many as its bytes take): what a reader copying glyphs in order writes.  The BPE vocabulary
    makes most words one token, so reading a word otherwise means naming it from its glyphs,
    a spelling the small model never learns (session 28: words came from priors while the
    single-token digits were read)."""
    return [t for ch in text for t in tok.encode(ch)]


def encode_sample(tok, s, vc, merge=None, thinking=False, spell=False):
    """sample dict(image, prompt, answer) -> ids (-1 where image rows go), labels, pos, crops.
    spell: the answer of a reading task (synth.READ_TASKS) one character per token (spelled)."""
    merge = merge or vc.merge
    ids, labels, pos = [], [], []
    spans = []
    p = 0

    def add_text(text, train=False, chars=False):
        nonlocal p
        t = spelled(tok, text) if chars else tok.encode(text)
        ids.extend(t)
        labels.extend(t if train else [-100] * len(t))
        pos.append(text_positions(len(t), p))
        p += len(t)

    def add_image(ci, crop):
        nonlocal p
        nx, ny = crop_tokens(crop.shape, vc, merge)
        spans.append((len(ids), ci))
        ids.extend([-1] * (nx * ny))
        labels.extend([-100] * (nx * ny))
        pp, adv = image_positions(p, nx, ny)
        pos.append(pp)
        p += adv

    add_text("<|im_start|>user\n")
    crops = []
    if s.get('image') is not None:
        crops, grid = image_to_crops(s['image'], vc, merge, s.get('scale', 1.0))
        add_text("<image>")
        add_image(0, crops[0])
        add_text("</image>")
        if grid is not None:
            cols, rows = grid
            for r in range(rows):
                for c in range(cols):
                    add_text("<slice>")
                    add_image(1 + r * cols + c, crops[1 + r * cols + c])
                    add_text("</slice>")
                if r != rows - 1:
                    add_text("\n")
        add_text("\n" + s['prompt'] + "<|im_end|>\n<|im_start|>assistant\n" + ("" if thinking else THINK_OFF))
    else:
        add_text(s['prompt'] + "<|im_end|>\n<|im_start|>assistant\n" + ("" if thinking else THINK_OFF))
    if s.get('answer') is not None:
        if spell and s.get('task') in synth.READ_TASKS:
            add_text(s['answer'], train=True, chars=True)
            add_text("<|im_end|>", train=True)
        else:
            add_text(s['answer'] + "<|im_end|>", train=True)
    return dict(ids=ids, labels=labels, pos=torch.cat(pos, 0), crops=crops, img_spans=spans, next_pos=p,
                merge=merge)
