#!/usr/bin/python3
"""The training fast paths (model.set_fast_training) compute what the reference forward does.

    /usr/bin/python3 scripts/ref/check_train_fast.py [--dtype both|float32|float64] [--mutate WHAT]

Runs one training batch of synth.py samples (images in 16x and 4x mode, padding,
the probe loss) through train.py's loss with the reference path and with the fast
path, from the same weights, and compares the loss and the gradient of every
parameter: max |fast - ref| / max |ref| per tensor.  float64: the paths must agree
to 1e-9 (they are the same algebra; a bug shows as O(1)).  float32: the losses to
1e-5, and the fast gradients must be no further from the float64 answer than 2x
the reference's own float32 error (which is ~5e-5 on this batch, so a flat 1e-5
between the two float32 paths would only measure rounding).  Exits 1 on failure.
--mutate breaks the fast path on purpose (expert: slots run through the wrong
expert; deltanet: the state is not carried from one chunk to the next;
router-grad: the hand-written expert backward drops the routing weights'
gradient), so a test can show that this check fails when the fast path is wrong.
--ckpt runs the same check with a checkpoint's weights.
"""
import argparse
import copy
import os
import random
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, '..', 'data'))

import model as M   # noqa: E402
import chatfmt   # noqa: E402
import compact   # noqa: E402
import probe as probe_mod   # noqa: E402
import train   # noqa: E402


def mutate(what):
    if what == 'expert':
        orig = M._RoutedExperts.apply

        def wrong(xs, w, gate, up, down, counts):
            # every group of slots runs through the next expert's weights
            return orig(xs, w, gate.roll(1, 0), up.roll(1, 0), down.roll(1, 0), counts)
        M._RoutedExperts.apply = wrong
    elif what == 'deltanet':
        orig_fn = M.delta_rule_chunked_train

        def no_carry(q, k, v, g, beta, S, chunk=64):
            # the state is (almost) forgotten at each chunk's first token
            g = g.clone()
            g[:, ::chunk] = -30.0
            return orig_fn(q, k, v, g, beta, S, chunk)
        M.delta_rule_chunked_train = no_carry
    elif what == 'router-grad':
        orig_bw = M._RoutedExperts.backward

        def no_dw(ctx, dout):
            # the routing weights (and so the router) get no gradient from the experts
            g = list(orig_bw(ctx, dout))
            g[1] = torch.zeros_like(g[1])
            return tuple(g)
        M._RoutedExperts.backward = staticmethod(no_dw)
    elif what:
        raise SystemExit(f'check_train_fast.py: unknown --mutate {what!r}')


def batch_seqs(tok, vc, head):
    import synth
    tasks = ['scene_caption', 'receipt_read', 'screenshot_read', 'text', 'scene_count', 'receipt_total']
    seqs = []
    for i, task in enumerate(tasks):
        marks = []
        s = synth.sample('train', 1000 + i, task=task, marks=marks)
        mg = (4, 2)[i % 2]
        sq = chatfmt.encode_sample(tok, s, vc, mg)
        if marks and head is not None:
            sq['probe'] = probe_mod.targets(marks, s['image'].size, vc, mg, [c.shape for c in sq['crops']],
                                            synth.mark_labels, len(synth.MARK_LABELS))
        seqs.append(sq)
    return seqs


def loss_and_grads(model, head, seqs, fast):
    M.set_fast_training(model, fast)
    model.zero_grad(set_to_none=True)
    head.zero_grad(set_to_none=True)
    batch = train.build_batch(model, seqs)
    loss, ce, aux, _ = train.loss_fn(model, batch, 0.01)
    loss = loss + 0.3 * probe_mod.loss(head, batch['feats'], seqs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    grads.update({'probe.' + n: p.grad.detach().clone() for n, p in head.named_parameters()})
    return float(loss), grads


def rel_errors(g, ref, floor):
    """worst over tensors of max |g - ref| / max |ref| (denominator at least floor), and its name"""
    return max((float((g[n].double() - r.double()).abs().max()) / max(float(r.abs().max()), floor), n)
               for n, r in ref.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--dtype', default='both', choices=('both', 'float32', 'float64'))
    ap.add_argument('--samples', type=int, default=6, help='batch size (1-6)')
    ap.add_argument('--mutate', default='', help='expert, deltanet or router-grad: break the fast path on purpose')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--ckpt', default=None, help="a train.py checkpoint's weights instead of random ones")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    mutate(a.mutate)
    import bpe
    import synth
    tok = bpe.default()
    torch.manual_seed(5)
    tc = M.TextConfig(vocab=len(tok.tokens))
    vc = M.VisionConfig()
    model = M.MiniCPMV(tc, vc)
    model.text.reset_parameters(5)
    # a fresh shared-expert gate is exactly 0: give it a trained-looking spread
    with torch.no_grad():
        for b in model.text.blocks:
            b.moe.gate_inp_shexp.normal_(0, 0.1)
    head = torch.nn.Linear(tc.hidden, len(synth.MARK_LABELS))
    if a.ckpt:
        d = compact.load(a.ckpt)   # a compact checkpoint too
        model = M.MiniCPMV.from_config(d['config'])
        model.load_state_dict(d['model'])
        if 'probe' in d:
            head.load_state_dict(d['probe'])
        vc = model.vc
        print(f'weights of {a.ckpt} (step {d["state"]["step"]})')
        del d
    model.train()
    seqs32 = batch_seqs(tok, vc, head)[:a.samples]
    T = max(len(sq['ids']) for sq in seqs32)
    pad = sum(T - len(sq['ids']) for sq in seqs32) / (T * len(seqs32))
    print(f'{len(seqs32)} samples x {T} tokens ({pad:.0%} padding)')
    res = {}
    for dt in (['float64', 'float32'] if a.dtype == 'both' else [a.dtype]):
        t = getattr(torch, dt)
        m, h = copy.deepcopy(model).to(t), copy.deepcopy(head).to(t)
        seqs = [dict(sq, crops=[c.to(t) for c in sq['crops']],
                     **({'probe': [x.to(t) for x in sq['probe']]} if 'probe' in sq else {})) for sq in seqs32]
        for fast in (False, True):
            res[(dt, fast)] = loss_and_grads(m, h, seqs, fast)
        del m, h, seqs
        if set(res[(dt, False)][1]) != set(res[(dt, True)][1]):
            print(f'FAIL: {dt}: gradients of different parameters')
            sys.exit(1)
    # the hand-written expert backward against finite differences, idle experts included
    gen = torch.Generator().manual_seed(0)
    E, Fe, H = 4, 8, 16
    ins = [torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()
           for shape in ((6, H), (6,), (E, Fe, H), (E, Fe, H), (E, H, Fe))]
    counts = [2, 0, 4, 0]
    ok = torch.autograd.gradcheck(lambda *t: M._RoutedExperts.apply(*t, counts), ins, raise_exception=False)
    print(f'_RoutedExperts gradcheck (float64, two idle experts): {"ok" if ok else "FAIL"}')
    ref = res.get(('float64', False))
    if ref:
        # float64: the two paths are the same algebra, so they agree to rounding
        floor = 1e-4 * max(float(r.abs().max()) for r in ref[1].values())
        le = abs(res[('float64', True)][0] - ref[0]) / abs(ref[0])
        ge, gn = rel_errors(res[('float64', True)][1], ref[1], floor)
        good = le <= 1e-12 and ge <= 1e-9
        ok &= good
        print(f'float64 fast vs reference: loss {le:.2g} (tol 1e-12), worst gradient {ge:.3g} ({gn}, tol 1e-9)'
              f'{"" if good else "  FAIL"}')
    if ('float32', False) in res:
        r32, f32 = res[('float32', False)], res[('float32', True)]
        le = abs(f32[0] - r32[0]) / abs(r32[0])
        ge, gn = rel_errors(f32[1], r32[1], 1e-4 * max(float(r.abs().max()) for r in r32[1].values()))
        good = le <= 1e-5
        line = f'float32 fast vs reference: loss {le:.2g} (tol 1e-5), worst gradient {ge:.3g} ({gn})'
        if ref:
            # float32 rounding alone moves this batch's gradients by ~5e-5 (the reference's own
            # error against float64): the fast path must be no less accurate than the reference
            er, en = rel_errors(r32[1], ref[1], floor)
            ef, efn = rel_errors(f32[1], ref[1], floor)
            g2 = ef <= 2 * er + 1e-6
            good &= g2
            line += f'; against float64: reference {er:.3g} ({en}), fast {ef:.3g} ({efn}, tol 2x reference)'
        else:
            good &= ge <= 1e-4
            line += ' (tol 1e-4)'
        ok &= good
        print(line + ('' if good else '  FAIL'))
    if not ok:
        print('FAIL')
        sys.exit(1)
    print('ok')


if __name__ == '__main__':
    main()
