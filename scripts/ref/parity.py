#!/usr/bin/python3
"""Reference vs llama.cpp (the peer) on one text GGUF: greedy tokens and first logits.

    parity.py --model M.gguf (--tokens 1,2,3 | --prompt TEXT [--chat]) [-n 16] [--tol 1e-3]
              [--stop-eog] [--near-tie]
exit 0 when the greedy tokens are equal and max |logit diff| <= tol * max |logit|;
prints one line with the figures. Exit 77 when node or the peer is missing.
--near-tie also passes tokens that part at one step k where the reference, fed the common
prefix, prefers its own token over the peer's by less than 2x the max |logit diff| measured
on the first step (parity_c.py's rule): the two sides' arithmetic differs by about that
much (float64 here, f16/f32 with quantized activations there), so a choice closer than
that may fall either way; the tokens after k are not compared (the two continue from
different prefixes).
--stop-eog compares the answers: the tokens up to and including the reference's first
end-of-generation token (the GGUF's eos id), which the peer must emit at the same step.
What a model writes after it has finished answering is outside what it was trained on;
there the float reference and llama.cpp's quantized activations may part on a near-tie.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..'))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--tokens')
    ap.add_argument('--prompt')
    ap.add_argument('--chat', action='store_true')
    ap.add_argument('-n', type=int, default=16)
    ap.add_argument('--tol', type=float, default=1e-3)
    ap.add_argument('--stop-eog', action='store_true')
    ap.add_argument('--near-tie', action='store_true')
    a = ap.parse_args()
    run = os.path.join(ROOT, 'scripts', 'peer', 'run.mjs')
    if not shutil.which('node') or not os.path.isdir(os.path.join(ROOT, 'scripts', 'peer', 'node_modules', 'node-llama-cpp')):
        print('parity: llama.cpp peer absent (scripts/setup.sh installs it)', file=sys.stderr)
        return 77
    cmd = [sys.executable, os.path.join(HERE, 'dump.py'), '--model', a.model, '-n', str(a.n), '--double']
    if a.tokens:
        cmd += ['--tokens', a.tokens]
    else:
        cmd += ['--prompt', a.prompt] + (['--chat'] if a.chat else [])
    with tempfile.TemporaryDirectory() as td:
        ref = json.loads(subprocess.run(cmd + ['--out-dir', td], check=True, capture_output=True, text=True).stdout)
        mine = np.load(os.path.join(td, 'first_logits.npy'))
    ids = ','.join(map(str, ref['prompt_tokens']))
    # stdout to a regular file: node may exit before a pipe drains (output cut at 64 KiB)
    with tempfile.TemporaryFile('w+') as fo:
        out = subprocess.run(['node', run, '--model', a.model, '--tokens', ids, '-n', str(a.n), '--logits',
                              '--threads', '1'], stdout=fo, stderr=subprocess.PIPE, text=True)
        fo.seek(0)
        text = fo.read()
    if out.returncode != 0:
        print(f'parity: peer failed: {out.stderr.strip()}', file=sys.stderr)
        return 1
    peer = json.loads(text)
    fl = np.array(peer['first_logits'], dtype=np.float64)
    diff = float(np.abs(fl - mine).max())
    scale = float(np.abs(mine).max())
    rt, pt = ref['tokens'], peer['tokens']
    what = 'greedy'
    if a.stop_eog:
        sys.path.insert(0, HERE)
        import gguf
        eos = int(gguf.read(a.model, load=False).kv['tokenizer.ggml.eos_token_id'])
        if eos in rt:
            rt, pt = rt[:rt.index(eos) + 1], pt[:rt.index(eos) + 1]
        what = 'answer'
    same = pt == rt
    n_same = next((i for i, (x, y) in enumerate(zip(pt, rt)) if x != y), len(rt))
    tie = ''
    if not same and a.near_tie and n_same < len(pt):
        from parity_c import ref_margin
        gap = ref_margin(a.model, ref['prompt_tokens'] + rt[:n_same], rt[n_same], pt[n_same], mine if n_same == 0 else None)
        same = gap < 2 * diff
        tie = f', parted at step {n_same}: ref margin {gap:.4g} vs bound {2 * diff:.3g}' + \
              (' (near-tie)' if same else ' (FAIL)')
    print(f'parity: {os.path.basename(a.model)} prompt {len(ref["prompt_tokens"])} tokens, {what} {n_same}/{len(rt)} '
          f'equal, max |dlogit| {diff:.3g} (max |logit| {scale:.3g}){tie}')
    if pt != rt:
        print(f'  ref  {rt}\n  peer {pt}')
    return 0 if same and diff <= a.tol * scale else 1


if __name__ == '__main__':
    sys.exit(main())
