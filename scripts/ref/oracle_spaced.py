#!/usr/bin/python3
"""oracle_read.py on word_read drawn one glyph per 28-px cell (one 4x token each).

    scripts/ref/oracle_spaced.py --ckpt CKPT --feats oracle --tasks word_read [oracle_read options]

The same strings as synth.word_read (spaces dropped, at most 7 glyphs), 20-24 px,
each glyph centred in its own 28x28 cell of a row: the layout a slicing that keeps
a glyph near one token would give.  Session 8: from perfect rows (one vector per
glyph and place), reading starts here (digit CE 1.59 at 4x after 3,480 samples)
where naturally spaced words stay at chance (2.75 after 3,200); with vectors
shared across places (oracle_read.py --factored) natural spacing is read as
well (1.81 / 1.94 after 2,888): examples/models/README.md.
"""
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))
from PIL import Image, ImageDraw   # noqa: E402

import synth   # noqa: E402


def word_sample(rng, rrng, marks=None):
    """synth.word_sample's contract, one glyph per 28-px cell."""
    f = synth.font(rng.choice(synth.SNIPPET_FONTS), rng.randint(20, 24))
    text = synth.word_text(rng).replace(' ', '')[:7]
    img = Image.new('RGB', (224, 224), (246, 244, 238))
    dr = ImageDraw.Draw(img)
    c0, r = rrng.randint(0, 8 - len(text)), rrng.randint(0, 7)
    for k, ch in enumerate(text):
        w = f.getlength(ch)
        x, y = (c0 + k) * 28 + 14 - w / 2, r * 28 + 14 - f.size * 0.6
        dr.text((x, y), ch, font=f, fill=(30, 30, 30))
        if marks is not None:
            marks.append((x + w / 2, y + f.size * 0.6, ch))
    return img, rng.choice(synth.SNIPPET_PROMPTS), text


if __name__ == '__main__':
    synth.word_sample = word_sample
    sys.argv = ['oracle_read.py'] + sys.argv[1:]
    runpy.run_path(os.path.join(HERE, 'oracle_read.py'), run_name='__main__')
